"""Per-sample and per-cluster neuron scores for one layer: the engine's public entry points."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import nn

from .errors import AttributionError
from .guards import eval_mode
from .layers import resolve_layer
from .methods import METHODS, REGISTRY, Batch, Targets
from .split import runner_for

Inputs = Union[torch.Tensor, np.ndarray, Iterable]
Progress = Optional[Callable[[float], object]]
REDUCTIONS = ("mean", "mean_abs", "std")
_MAX_ELEMENTS_PER_PASS = 1 << 24  # bounds stacked variants (steps, ablated neurons, masks)


def model_device(model: nn.Module) -> torch.device:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _as_batch_tensor(x, model: nn.Module, device: torch.device) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise AttributionError(f"Inputs must be a tensor, a NumPy array or an iterable of "
                               f"batches; got {type(x).__name__}.")
    if x.is_floating_point():
        dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
        x = x.to(device=device, dtype=dtypes[0] if dtypes else x.dtype)
    else:
        x = x.to(device)
    return x


def n_samples(inputs: Inputs) -> Optional[int]:
    """Number of samples when known up front (tensors, arrays, sized loaders), else None."""
    if isinstance(inputs, (torch.Tensor, np.ndarray)):
        return int(inputs.shape[0])
    dataset = getattr(inputs, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return None


def iter_batches(inputs: Inputs, batch_size: int) -> Iterator[torch.Tensor | np.ndarray]:
    """Slices of an in-memory array, or the items (a tensor or an (x, ...) tuple's x) of an
    iterable of batches such as a DataLoader or a memory-mapped array."""
    if isinstance(inputs, (torch.Tensor, np.ndarray)):
        for begin in range(0, inputs.shape[0], batch_size):
            yield inputs[begin:begin + batch_size]
        return
    try:
        iterator = iter(inputs)
    except TypeError:
        raise AttributionError(f"Inputs must be a tensor, a NumPy array or an iterable of "
                               f"batches; got {type(inputs).__name__}.") from None
    for item in iterator:
        yield item[0] if isinstance(item, (tuple, list)) else item


def _check_targets(targets: Targets, total: Optional[int]) -> Targets:
    if targets is None or (isinstance(targets, str) and targets == "all"):
        return targets
    if isinstance(targets, str):
        raise AttributionError(f"targets={targets!r} is not understood: pass a LongTensor of "
                               "class ids, None (predicted class) or 'all'.")
    if (not isinstance(targets, torch.Tensor) or targets.dim() != 1
            or targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool):
        raise AttributionError("targets must be a LongTensor [N] of class ids, None (the "
                               "predicted class) or 'all'; convert with torch.as_tensor(y).long().")
    if total is not None and targets.shape[0] != total:
        raise AttributionError(f"targets has {targets.shape[0]} entries but there are "
                               f"{total} samples.")
    return targets.long()


def _check_method(method: str) -> None:
    if method not in REGISTRY:
        raise AttributionError(f"Unknown method {method!r}. Methods: {', '.join(METHODS)}.")


def score_batches(model: nn.Module, layer, inputs: Inputs, targets: Targets = None,
                  method: str = "gradient", *, batch_size: int = 256, n_steps: int = 32,
                  progress: Progress = None, seed: int = 0
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (start index, scores) per batch: scores [B, n] (or [B, n_classes, n] for "all").

    The streaming core of `neuron_scores` and `cluster_scores`; the model is in eval mode
    while the generator runs and restored when it finishes or is closed.
    """
    _check_method(method)
    if batch_size < 1 or n_steps < 1:
        raise AttributionError("batch_size and n_steps must be positive integers.")
    name, module = resolve_layer(model, layer)
    total = n_samples(inputs)
    targets = _check_targets(targets, total)
    device = model_device(model)
    function = REGISTRY[method].function
    runner = None
    start = 0
    with eval_mode(model):
        for raw in iter_batches(inputs, batch_size):
            x = _as_batch_tensor(raw, model, device)
            if x.shape[0] == 0:
                continue
            if runner is None:
                runner = runner_for(model, name, module, x)
            batch_targets = targets
            if isinstance(targets, torch.Tensor):
                if start + x.shape[0] > targets.shape[0]:
                    raise AttributionError("There are more samples than targets.")
                batch_targets = targets[start:start + x.shape[0]].to(device)
            per_row = max(1, x[0].numel())
            scores = function(Batch(runner, x, _validated(batch_targets, runner, x), n_steps,
                                    start, seed, max(x.shape[0], _MAX_ELEMENTS_PER_PASS // per_row)))
            yield start, scores.detach().to("cpu", torch.float32)
            start += x.shape[0]
            if progress is not None:
                progress(min(1.0, start / total) if total else float("nan"))
    if start == 0:
        raise AttributionError("There are no samples to score (the inputs are empty).")


def _validated(targets: Targets, runner, x: torch.Tensor) -> Targets:
    """Check class ids against the model's number of classes (known after one pass)."""
    if not isinstance(targets, torch.Tensor):
        return targets
    n_classes = getattr(runner, "n_classes", None)
    if n_classes is None:
        z, _, logits = runner.capture(x[:1])
        if z.dim() < 2:
            raise AttributionError("This layer has no neuron axis; pick one from list_layers().")
        n_classes = runner.n_classes = logits.shape[1]
    if targets.numel() and (targets.min() < 0 or targets.max() >= n_classes):
        raise AttributionError(f"Target class ids must lie in 0..{n_classes - 1} (the model "
                               f"has {n_classes} outputs); got {int(targets.min())}.."
                               f"{int(targets.max())}.")
    return targets


def neuron_scores(model: nn.Module, layer, inputs: Inputs, targets: Targets = None,
                  method: str = "gradient", *, batch_size: int = 256, n_steps: int = 32,
                  progress: Progress = None, seed: int = 0) -> torch.Tensor:
    """Per-sample neuron scores for one layer.

    Args:
        model: a classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name (as in `model.named_modules()`) or the module itself.
        inputs: [N, ...] tensor or array, or an iterable of batches (DataLoader).
        targets: LongTensor [N] of class ids, None (predicted class) or "all".
        method: one of `METHODS`.
        batch_size: samples per pass; results do not depend on it.
        n_steps: integration steps for integrated_gradients and conductance.
        progress: called with the fraction done after each batch; may raise to stop.
        seed: seed of the `random` method.
    Returns:
        float32 CPU tensor [N, n_neurons], or [N, n_classes, n_neurons] for targets="all".
    """
    parts = [scores for _, scores in score_batches(
        model, layer, inputs, targets, method, batch_size=batch_size, n_steps=n_steps,
        progress=progress, seed=seed)]
    return torch.cat(parts)


def cluster_codes(clusters: Sequence, total: Optional[int]) -> tuple[np.ndarray, pd.Index]:
    """(codes [N] in 0..G-1, the G cluster ids, sorted when sortable)."""
    values = np.asarray(clusters, dtype=object if not isinstance(clusters, np.ndarray)
                        else clusters.dtype)
    if values.ndim != 1:
        raise AttributionError("clusters must be a 1-D array with one id per sample.")
    if total is not None and len(values) != total:
        raise AttributionError(f"clusters has {len(values)} entries but there are "
                               f"{total} samples.")
    series = pd.Series(values)
    if series.isna().any():
        raise AttributionError("clusters contains missing ids (NaN/None); give every sample "
                               "a cluster.")
    try:
        codes, uniques = pd.factorize(series, sort=True)
    except TypeError:  # ids of mixed, unorderable types
        codes, uniques = pd.factorize(series, sort=False)
    return codes.astype(np.int64), pd.Index(uniques, name="cluster")


def cluster_scores(model: nn.Module, layer, inputs: Inputs, targets: Targets, clusters,
                   method: str = "gradient", *, reduce: str = "mean", batch_size: int = 256,
                   n_steps: int = 32, progress: Progress = None, seed: int = 0) -> pd.DataFrame:
    """Per-cluster neuron scores, streamed: memory O(clusters x neurons), not O(N x neurons).

    Args:
        clusters: 1-D array of hashable ids [N], one per sample.
        reduce: "mean" (signed), "mean_abs" or "std" (sample std; NaN for a 1-sample cluster).
        Other arguments as in `neuron_scores`.
    Returns:
        DataFrame with one row per cluster (index "cluster"), one column per neuron
        (0..n_neurons-1) and a column "n" (cluster size). For targets="all" the index is
        (cluster, class): `df.loc[c]` is the classes x neurons table of cluster c.
    """
    if reduce not in REDUCTIONS:
        raise AttributionError(f"Unknown reduce {reduce!r}; use one of {', '.join(REDUCTIONS)}.")
    codes, ids = cluster_codes(clusters, n_samples(inputs))
    n_groups = len(ids)
    counts = np.bincount(codes, minlength=n_groups).astype(np.float64)
    sums = sums_abs = sums_sq = None
    for start, scores in score_batches(model, layer, inputs, targets, method,
                                       batch_size=batch_size, n_steps=n_steps,
                                       progress=progress, seed=seed):
        if start + scores.shape[0] > len(codes):
            raise AttributionError("There are more samples than cluster ids.")
        index = torch.from_numpy(codes[start:start + scores.shape[0]])
        values = scores.double()
        if sums is None:
            sums, sums_abs, sums_sq = (torch.zeros((n_groups,) + values.shape[1:],
                                                   dtype=torch.float64) for _ in range(3))
        sums.index_add_(0, index, values)
        sums_abs.index_add_(0, index, values.abs())
        sums_sq.index_add_(0, index, values * values)
    sizes = torch.from_numpy(counts).view((-1,) + (1,) * (sums.dim() - 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        if reduce == "mean":
            table = sums / sizes
        elif reduce == "mean_abs":
            table = sums_abs / sizes
        else:
            variance = (sums_sq - sums * sums / sizes) / (sizes - 1)
            table = variance.clamp_min(0).sqrt()
    return _cluster_frame(table.numpy(), ids, counts)


def _cluster_frame(table: np.ndarray, ids: pd.Index, counts: np.ndarray) -> pd.DataFrame:
    if table.ndim == 2:
        frame = pd.DataFrame(table, index=ids, columns=range(table.shape[1]))
        frame["n"] = counts.astype(np.int64)
        return frame
    n_groups, n_classes, n_neurons = table.shape
    index = pd.MultiIndex.from_product([ids, range(n_classes)], names=["cluster", "class"])
    frame = pd.DataFrame(table.reshape(n_groups * n_classes, n_neurons), index=index,
                         columns=range(n_neurons))
    frame["n"] = np.repeat(counts, n_classes).astype(np.int64)
    return frame

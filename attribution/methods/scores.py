"""Per-sample and per-cluster neuron scores for one layer: the engine's public entry points."""
from __future__ import annotations

import contextlib
import copy
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..engine import model_io
from ..errors import AttributionError
from ..defaults import (DEFAULT_BATCH_SIZE, DEFAULT_METHOD, DEFAULT_N_STEPS, DEFAULT_REDUCE,
                        DEFAULT_SEED)
from ..engine.guards import autograd_input, engine_modes, eval_mode
from ..engine.layers import resolve_layer
from .registry import METHODS, REGISTRY, Batch, Targets
from ..engine.runners import layer_attrs, runner_for

Inputs = Union[torch.Tensor, np.ndarray, Mapping, Iterable]
Progress = Optional[Callable[[float], object]]
REDUCTIONS = ("mean", "mean_abs", "std")
_MAX_ELEMENTS_PER_PASS = 1 << 24  # bounds stacked variants (steps, ablated neurons, masks)


def model_device(model: nn.Module) -> torch.device:
    """Where the model's first parameter (or buffer) lives; cpu for a model without any."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if first is None else first.device


def resolve_device(device: Union[str, torch.device]) -> torch.device:
    """`device` as a torch.device that exists here; AttributionError when it does not."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise AttributionError(f"Unknown device {device!r}; use 'cpu', 'cuda' or "
                               "'cuda:N'.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise AttributionError(
                f"Device {device!r} asks for a GPU, but CUDA is not available here (torch "
                f"{torch.__version__}); use device 'cpu', or install a CUDA build of torch.")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise AttributionError(f"Device {device!r} does not exist: this machine has "
                                   f"{torch.cuda.device_count()} GPU(s), cuda:0.. .")
    elif resolved.type != "cpu":
        raise AttributionError(f"Device {device!r} is not supported; use 'cpu' or 'cuda'.")
    return resolved


def on_device(model: nn.Module, device: Union[str, torch.device, None]) -> nn.Module:
    """`model` when it already lives on `device` (or device is None), else a copy moved there.

    The caller's model never moves (a model shared by a server stays where it is); move it
    yourself (`model.to(device)`) to avoid the copy. A model on the meta device (shapes
    without weights) raises AttributionError.
    """
    if any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()]):
        raise AttributionError(
            "The model's weights are on the meta device: it has shapes but no values (built "
            "under torch.device('meta') or an empty-weights loader), so no score can be "
            "computed. Load its weights first, e.g. model.to_empty(device='cpu') then "
            "model.load_state_dict(state).")
    if device is None:
        return model
    wanted, current = resolve_device(device), model_device(model)
    if wanted.type == "cuda" and wanted.index is None:
        wanted = torch.device("cuda", torch.cuda.current_device())
    if current == wanted:
        return model
    return copy.deepcopy(model).to(wanted)


def as_batch_tensor(x, model: nn.Module, device: torch.device):
    """One batch (tensor, array or named inputs) as tensors on `device` for `model`, detached
    and ordinary even when made under torch.inference_mode() (`guards.autograd_input`)."""
    batch = model_io.to_model(x, model, device)
    if isinstance(batch, model_io.NamedInputs):
        return batch.map(autograd_input)
    return autograd_input(batch)


def n_samples(inputs: Inputs) -> Optional[int]:
    """Number of samples when known up front (tensors, arrays, named inputs, `NpyRows`,
    sized loaders), else None."""
    shape = getattr(model_io.named(inputs), "shape", None)
    if shape is not None:
        return int(shape[0])
    dataset = getattr(inputs, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return None


def iter_labelled_batches(inputs: Inputs, batch_size: int) -> Iterator[tuple[object, object]]:
    """(x, y) per batch: slices of an in-memory or memory-mapped array or of named inputs
    (y None), or the items of an iterable of batches such as a DataLoader (x, an (x, y, ...)
    tuple, or a dict of named inputs whose "labels" entry, if any, is y)."""
    inputs = model_io.named(inputs)
    if model_io.is_batch(inputs):
        for begin in range(0, model_io.n_rows(inputs), batch_size):
            yield model_io.take(inputs, slice(begin, begin + batch_size)), None
        return
    try:
        iterator = iter(inputs)
    except TypeError:
        raise AttributionError(f"Inputs must be a tensor, a NumPy array or an iterable of "
                               f"batches; got {type(inputs).__name__}.") from None
    for item in iterator:
        if isinstance(item, (tuple, list)):
            yield model_io.named(item[0]), item[1] if len(item) > 1 else None
        elif isinstance(item, Mapping):  # a transformers-style batch
            entries = dict(item)
            labels = entries.pop("labels", None)
            yield model_io.named(entries), labels
        else:
            yield item, None


def iter_batches(inputs: Inputs, batch_size: int) -> Iterator[torch.Tensor | np.ndarray]:
    """The x of each batch of `iter_labelled_batches`."""
    for x, _ in iter_labelled_batches(inputs, batch_size):
        yield x


def batch_labels(labels, size: int, device: torch.device) -> torch.Tensor:
    """The y of one (x, y) batch as a LongTensor [B] (targets="labels")."""
    if labels is None:
        raise AttributionError("targets='labels' reads y from batches (x, y, ...), but these "
                               "batches carry no labels; pass targets as a LongTensor [N] "
                               "or None (the predicted class).")
    labels = torch.as_tensor(np.asarray(labels) if not isinstance(labels, torch.Tensor)
                             else labels)
    if (labels.dim() != 1 or labels.shape[0] != size or labels.is_floating_point()
            or labels.dtype == torch.bool or labels.is_complex()):
        raise AttributionError(f"targets='labels' needs integer class ids y [B] in each "
                               f"(x, y) batch; got y of shape {list(labels.shape)} and dtype "
                               f"{labels.dtype} for {size} samples.")
    return labels.to(device=device, dtype=torch.long)


def check_targets(targets: Targets, total: Optional[int], inputs: Inputs) -> Targets:
    """`targets` checked against the number of samples (LongTensor [N], None, "all" or
    "labels"); AttributionError with what to pass otherwise."""
    if targets is None or (isinstance(targets, str) and targets == "all"):
        return targets
    if isinstance(targets, str) and targets == "labels":
        if model_io.is_batch(model_io.named(inputs)):
            raise AttributionError("targets='labels' reads y from the (x, y) batches of a "
                                   "DataLoader; with array inputs pass the labels as a "
                                   "LongTensor [N].")
        return targets
    if isinstance(targets, str):
        raise AttributionError(f"targets={targets!r} is not understood: pass a LongTensor of "
                               "class ids, None (predicted class), 'all', or 'labels' (the y "
                               "of each (x, y) batch).")
    if (not isinstance(targets, torch.Tensor) or targets.dim() != 1
            or targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool):
        raise AttributionError("targets must be a LongTensor [N] of class ids, None (the "
                               "predicted class) or 'all'; convert with torch.as_tensor(y).long().")
    if total is not None and targets.shape[0] != total:
        raise AttributionError(f"targets has {targets.shape[0]} entries but there are "
                               f"{total} samples.")
    return targets.long()


def check_method(method: str) -> None:
    """AttributionError unless `method` is a registered scoring method."""
    if method not in REGISTRY:
        raise AttributionError(f"Unknown method {method!r}. Methods: {', '.join(METHODS)}.")


def score_batches(model: nn.Module, layer, inputs: Inputs, targets: Targets = None,
                  method: str = DEFAULT_METHOD, *, batch_size: int = DEFAULT_BATCH_SIZE,
                  n_steps: int = DEFAULT_N_STEPS, progress: Progress = None,
                  seed: int = DEFAULT_SEED, device=None, first_index: int = 0,
                  about_layer: Optional[dict] = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (start index, scores) per batch: scores [B, n] (or [B, n_classes, n] for "all").

    The streaming core of `neuron_scores` and `cluster_scores`; the model is in eval mode
    while the generator runs and restored when it finishes or is closed. `device` as in
    `neuron_scores`; `first_index` is the dataset index of the first input (a shard's
    offset), so the seeded `random` method gives every sample the same score in any shard.
    `about_layer`, a dict, receives `split.layer_attrs` of the layer scored (its neuron axis).
    """
    check_method(method)
    if batch_size < 1 or n_steps < 1:
        raise AttributionError("batch_size and n_steps must be positive integers.")
    name, _ = resolve_layer(model, layer)
    model = on_device(model, device)
    name, module = resolve_layer(model, name)
    total = n_samples(inputs)
    targets = check_targets(targets, total, inputs)
    device = model_device(model)
    scoring = REGISTRY[method]
    runner = None
    start = 0
    with eval_mode(model):
        for raw, labels in iter_labelled_batches(inputs, batch_size):
            # the caller's no_grad would zero gradients, autocast round, and a runner built
            # under inference_mode fails autograd; the caller's modes are back at each yield
            with engine_modes():
                x = as_batch_tensor(raw, model, device)
                rows = model_io.n_rows(x)
                if rows == 0:
                    continue
                if scoring.scales_inputs and not model_io.is_floating(x):
                    raise AttributionError(
                        f"{method} interpolates the inputs from a zero baseline, which "
                        f"{x.dtype} inputs (e.g. token ids) do not allow; use "
                        "integrated_gradients, which interpolates the layer's output instead.")
                if runner is None:
                    runner = runner_for(model, name, module, x)
                    if about_layer is not None:
                        about_layer.update(layer_attrs(runner))
                    if isinstance(targets, torch.Tensor):  # every batch's at once
                        targets = validated_targets(targets, runner).to(device)
                batch_targets = targets
                if isinstance(targets, torch.Tensor):
                    if start + rows > targets.shape[0]:
                        raise AttributionError("There are more samples than targets.")
                    batch_targets = targets[start:start + rows]
                elif targets == "labels":
                    batch_targets = validated_targets(batch_labels(labels, rows, device), runner)
                per_row = max(1, model_io.row_size(x), runner.layer_size)  # a stacked variant
                scores = scoring.function(Batch(runner, x, batch_targets, n_steps,
                                                first_index + start, seed,
                                                max(rows, _MAX_ELEMENTS_PER_PASS // per_row)))
                scores = scores.detach().to("cpu", torch.float32)
            yield start, scores
            start += rows
            if progress is not None:
                progress(min(1.0, start / total) if total else float("nan"))
    if start == 0:
        raise AttributionError("There are no samples to score (the inputs are empty).")


def validated_targets(targets: Targets, runner) -> Targets:
    """Check class ids against the model's number of classes (one reduction)."""
    if not isinstance(targets, torch.Tensor) or not targets.numel():
        return targets
    n_classes = runner.n_classes
    low, high = map(int, torch.aminmax(targets))
    if low < 0 or high >= n_classes:
        raise AttributionError(f"Target class ids must lie in 0..{n_classes - 1} (the model "
                               f"has {n_classes} outputs); got {low}..{high}.")
    return targets


def scored_layer(model: nn.Module, layer, inputs: Inputs, device=None) -> dict[str, object]:
    """`split.layer_attrs` of `layer` as every score of it on `inputs` sees it (its neuron
    axis), from the first sample (runners are cached: free after a computation). Reads
    one sample, so a one-shot iterator loses it."""
    about_layer: dict = {}
    batches = score_batches(model, layer, inputs, None, "activation", batch_size=1,
                            device=device, about_layer=about_layer)
    next(batches, None)
    batches.close()
    return about_layer


def neuron_scores(model: nn.Module, layer, inputs: Inputs, targets: Targets = None,
                  method: str = DEFAULT_METHOD, *, batch_size: int = DEFAULT_BATCH_SIZE,
                  n_steps: int = DEFAULT_N_STEPS, progress: Progress = None,
                  seed: int = DEFAULT_SEED, device=None) -> torch.Tensor:
    """Per-sample neuron scores for one layer.

    Args:
        model: a classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name (as in `model.named_modules()`) or the module itself.
        inputs: [N, ...] tensor or array (a memory-mapped .npy streams batch by batch), or an
            iterable of batches (a DataLoader) yielding x [B, ...] or (x, y, ...) tuples.
        targets: LongTensor [N] of class ids (in iteration order), None (predicted class),
            "all", or "labels": the y [B] of each (x, y) batch of an iterable, so a
            DataLoader's labels need not be gathered first.
        method: one of `METHODS`.
        batch_size: samples per pass for array inputs (an iterable keeps its own batches);
            results do not depend on it.
        n_steps: integration steps for integrated_gradients and conductance.
        progress: called with the fraction done after each batch; may raise to stop.
        seed: seed of the `random` method.
        device: where to compute ("cpu", "cuda", "cuda:1"); None = where the model is. A model
            elsewhere is copied there for the call, never moved.
    Returns:
        float32 CPU tensor [N, n_neurons], or [N, n_classes, n_neurons] for targets="all".
    """
    batches = score_batches(model, layer, inputs, targets, method, batch_size=batch_size,
                            n_steps=n_steps, progress=progress, seed=seed, device=device)
    with contextlib.closing(batches):  # a failure here still restores the model at once
        if not model_io.is_batch(model_io.named(inputs)):  # an iterable: N known at the end
            return torch.cat([scores for _, scores in batches])
        result = None  # written batch by batch: no second copy of every score at the end
        for start, scores in batches:
            if result is None:
                result = scores.new_empty((n_samples(inputs), *scores.shape[1:]))
            result[start:start + scores.shape[0]] = scores
        return result


def cluster_codes(clusters: Sequence, total: Optional[int]) -> tuple[np.ndarray, pd.Index]:
    """(codes [N] in 0..G-1, the G cluster ids, sorted when sortable)."""
    values = np.asarray(clusters, dtype=object if not isinstance(clusters, np.ndarray)
                        else clusters.dtype)
    if values.ndim != 1:
        raise AttributionError("clusters must be a 1-D array with one id per sample.")
    if total is not None and len(values) != total:
        raise AttributionError(f"clusters has {len(values)} entries but there are "
                               f"{total} samples.")
    if values.dtype.kind in "biuUS":  # ints or strings: no per-sample Python objects
        uniques, codes = np.unique(values, return_inverse=True)
        return codes.astype(np.int64), pd.Index(uniques, name="cluster")
    series = pd.Series(values)
    if series.isna().any():
        raise AttributionError("clusters contains missing ids (NaN/None); give every sample "
                               "a cluster.")
    try:
        codes, uniques = pd.factorize(series, sort=True)
    except TypeError:  # ids of mixed, unorderable types
        codes, uniques = pd.factorize(series, sort=False)
    return codes.astype(np.int64), pd.Index(uniques, name="cluster")


def find_cluster(wanted: object, ids: Sequence) -> object:
    """The id among `ids` that is `wanted`, or else the one that prints as `wanted` does (the
    command line's "3" is the cluster 3); AttributionError naming the ids otherwise."""
    index = pd.Index(ids)
    if wanted in index:
        return index[index.get_loc(wanted)]
    matches = [candidate for candidate in index if str(candidate) == str(wanted)]
    if len(matches) == 1:
        return matches[0]
    shown = ", ".join(map(str, index[:20])) + (", ..." if len(index) > 20 else "")
    raise AttributionError(f"Cluster {wanted!r} is not among the cluster ids ({shown}).")


def check_reduce(reduce: str) -> None:
    """AttributionError unless `reduce` is one of REDUCTIONS."""
    if reduce not in REDUCTIONS:
        raise AttributionError(f"Unknown reduce {reduce!r}; use one of {', '.join(REDUCTIONS)}.")


@dataclass
class ClusterStatistics:
    """Running per-cluster sums of scores: every reduction follows, and shards add up.

    Attributes:
        ids: the G cluster ids.
        counts: float64 [G], samples seen per cluster.
        sums, sums_abs, sums_sq: float64 [G, n] (or [G, n_classes, n]) sums of s, |s|, s*s.
        layer: `split.layer_attrs` of the layer scored, copied to the frame's attrs.
    """

    ids: pd.Index
    counts: torch.Tensor
    sums: torch.Tensor
    sums_abs: torch.Tensor
    sums_sq: torch.Tensor
    layer: dict = field(default_factory=dict)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The summable tensors (for an all_reduce across processes)."""
        return self.counts, self.sums, self.sums_abs, self.sums_sq

    def frame(self, reduce: str = DEFAULT_REDUCE) -> pd.DataFrame:
        """The `cluster_scores` table for `reduce` ("mean", "mean_abs" or "std")."""
        check_reduce(reduce)
        sizes = self.counts.view((-1,) + (1,) * (self.sums.dim() - 1))
        if reduce == "mean":
            table = self.sums / sizes
        elif reduce == "mean_abs":
            table = self.sums_abs / sizes
        else:
            variance = (self.sums_sq - self.sums * self.sums / sizes) / (sizes - 1)
            table = variance.clamp_min(0).sqrt()
        frame = _cluster_frame(table.numpy(), self.ids, self.counts.numpy())
        frame.attrs.update(self.layer)
        return frame


def cluster_statistics(model: nn.Module, layer, inputs: Inputs, targets: Targets,
                       codes: np.ndarray, ids: pd.Index, method: str = DEFAULT_METHOD, *,
                       batch_size: int = DEFAULT_BATCH_SIZE, n_steps: int = DEFAULT_N_STEPS,
                       progress: Progress = None, seed: int = DEFAULT_SEED, device=None,
                       first_index: int = 0,
                       on_batch: Optional[Callable[[int, torch.Tensor], object]] = None
                       ) -> ClusterStatistics:
    """Stream the scores of `inputs` into per-cluster sums: memory O(clusters x neurons).

    Args:
        codes: int64 [N], the cluster index (0..G-1) of each input (see `cluster_codes`).
        ids: the G cluster ids.
        first_index: dataset index of the first input (see `score_batches`).
        on_batch: called with (start, scores [B, ...]) of every batch, e.g. to write the
            per-sample scores to disk in the same pass.
        Other arguments as in `neuron_scores`.
    """
    counts = torch.zeros(len(ids), dtype=torch.float64)
    sums = sums_abs = sums_sq = None
    about_layer: dict = {}
    for start, scores in score_batches(model, layer, inputs, targets, method,
                                       batch_size=batch_size, n_steps=n_steps,
                                       progress=progress, seed=seed, device=device,
                                       first_index=first_index, about_layer=about_layer):
        if start + scores.shape[0] > len(codes):
            raise AttributionError("There are more samples than cluster ids.")
        index = torch.from_numpy(codes[start:start + scores.shape[0]])
        values = scores.double()
        if sums is None:
            sums, sums_abs, sums_sq = (torch.zeros((len(ids),) + values.shape[1:],
                                                   dtype=torch.float64) for _ in range(3))
        # index_put_ with accumulate: index_add_ is ~250x slower when every index is equal
        counts.index_put_((index,), torch.ones(len(index), dtype=torch.float64), accumulate=True)
        sums.index_put_((index,), values, accumulate=True)
        sums_abs.index_put_((index,), values.abs(), accumulate=True)
        sums_sq.index_put_((index,), values * values, accumulate=True)
        if on_batch is not None:
            on_batch(start, scores)
    return ClusterStatistics(ids, counts, sums, sums_abs, sums_sq, about_layer)


def cluster_scores(model: nn.Module, layer, inputs: Inputs, targets: Targets, clusters,
                   method: str = DEFAULT_METHOD, *, reduce: str = DEFAULT_REDUCE,
                   batch_size: int = DEFAULT_BATCH_SIZE, n_steps: int = DEFAULT_N_STEPS,
                   progress: Progress = None, seed: int = DEFAULT_SEED,
                   device=None) -> pd.DataFrame:
    """Per-cluster neuron scores, streamed: memory O(clusters x neurons), not O(N x neurons).

    Args:
        clusters: 1-D array of hashable ids [N], one per sample (in iteration order).
        reduce: "mean" (signed), "mean_abs" or "std" (sample std; NaN for a 1-sample cluster).
        Other arguments as in `neuron_scores`.
    Returns:
        DataFrame with one row per cluster (index "cluster"), one column per neuron
        (0..n_neurons-1) and a column "n" (cluster size). For targets="all" the index is
        (cluster, class): `df.loc[c]` is the classes x neurons table of cluster c. `attrs`
        say which axis of the layer's output the neurons are (`split.layer_attrs`).
    """
    check_reduce(reduce)
    codes, ids = cluster_codes(clusters, n_samples(inputs))
    statistics = cluster_statistics(model, layer, inputs, targets, codes, ids, method,
                                    batch_size=batch_size, n_steps=n_steps,
                                    progress=progress, seed=seed, device=device)
    return statistics.frame(reduce)


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


def cluster_table(per_sample: np.ndarray, clusters: Sequence, reduce: str) -> pd.DataFrame:
    """Reduce per-sample scores [N, n] over each cluster: the engine's table layout.

    Returns:
        DataFrame with index "cluster", columns 0..n-1 and "n" (like `cluster_scores`).
    """
    values = np.abs(per_sample) if reduce == "mean_abs" else per_sample
    frame = pd.DataFrame(values.astype(np.float64), columns=range(per_sample.shape[1]),
                         copy=False)  # a fresh array already; copying it was half the time
    groups = frame.groupby(np.asarray(clusters), sort=True)
    if reduce == "std":
        table = groups.std(ddof=1)
    else:
        table = groups.mean()
    table.index.name = "cluster"
    table["n"] = groups.size().astype(np.int64)
    return table

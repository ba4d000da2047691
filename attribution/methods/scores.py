"""Per-sample and per-cluster neuron scores for one layer: the engine's public entry points."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..engine import model_io
from ..engine.memory import empty_table
from ..errors import AttributionError
from ..defaults import (DEFAULT_BATCH_SIZE, DEFAULT_METHOD, DEFAULT_N_STEPS, DEFAULT_REDUCE,
                        DEFAULT_SEED)
from .passes import Inputs, LayerBatch, LayerPass, Progress, n_samples
from .passes import model_device, on_device  # noqa: F401 - imported from here elsewhere
from .paths import SUM_TOLERANCE, PathSums
from .registry import REGISTRY, Batch, Targets, method_names
from .shared import check_neurons
from ..engine.runners import layer_attrs

REDUCTIONS = ("mean", "mean_abs", "std")
_MAX_ELEMENTS_PER_PASS = {"cpu": 1 << 20, "other": 1 << 24}
"""Bounds a stacked pass of variants (steps, ablated neurons): on a CPU 4 MiB of float32,
which stays in cache (larger passes made exact ablation and the path methods slower); on a
GPU 64 MiB, which fills it."""
_LAYER_ELEMENTS_PER_CHUNK = 1 << 19
"""On a CPU a batch is scored in equal row chunks of at most this many layer-output values
(2 MiB of float32), so the layer's output, its gradient and their product stay in cache
(faster than whole batches on wide and conv layers; a small layer is one chunk)."""


@dataclass
class ScoreFacts:
    """What a scoring learns beside its scores (`neuron_scores(facts=...)`), filled in as
    it runs.

    Attributes:
        layer: `runners.layer_attrs` of the layer scored (its neuron axis).
        fit: a method fitted to the clusters: its fit, with a `note` (one sentence on how
            well it went, e.g. a probe's accuracy) and `usable` (False: its scores rank
            nothing); else None.
        sums: a path method's sums per sample (`paths.PathSums` of NumPy arrays [N], `sum_check`
            reads them), once every batch is scored; else None.
    """

    layer: dict = field(default_factory=dict)
    fit: Any = None
    sums: Optional[PathSums] = None

    def fit_attrs(self) -> dict:
        """The fit as a result's `attrs` hold it: "method_note" and "method_usable" (none
        for a method not fitted)."""
        return {} if self.fit is None else {"method_note": self.fit.note,
                                            "method_usable": self.fit.usable}


def check_method(method: str) -> None:
    """AttributionError unless `method` is a registered scoring method."""
    if method not in REGISTRY:
        raise AttributionError(f"Unknown method {method!r}. Methods: {', '.join(method_names())}.")


def score_batches(model: nn.Module, layer, inputs: Inputs, targets: Targets = None,
                  method: str = DEFAULT_METHOD, *, batch_size: int = DEFAULT_BATCH_SIZE,
                  n_steps: int = DEFAULT_N_STEPS, progress: Progress = None,
                  seed: int = DEFAULT_SEED, device=None, first_index: int = 0,
                  facts: Optional[ScoreFacts] = None, on_host: bool = True,
                  codes: Optional[np.ndarray] = None, ids: Optional[pd.Index] = None,
                  fitted=None, neurons: Optional[np.ndarray] = None
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (start index, scores) per batch: float32 scores [B, n] (or [B, n_classes, n] for
    "all"), on the CPU, or where they were computed when `on_host` is False (a GPU then
    copies nothing back, nor waits, per batch). With `neurons` (indices [m] of the layer's
    neurons, sorted, no repeats) only theirs: [B, m] (`Batch.neurons`).

    The streaming core of `neuron_scores` and `cluster_scores`; the model is in eval mode
    while the generator runs and restored when it finishes or is closed. `device` as in
    `neuron_scores`; `first_index` is the dataset index of the first input (a shard's
    offset), so the seeded `random` method gives every sample the same score in any shard.
    `facts` (a `ScoreFacts`) receives the layer's neuron axis, a fitted method's fit and a
    path method's sums per sample.

    A method fitted to clusters (`Method.fit`) needs `codes` (int64 [N], each input's index
    among the cluster `ids`, as `cluster_codes` gives them) and is fitted here on all the
    inputs, unless `fitted` (what `fit_method` returned for the same ids) is given.
    """
    check_method(method)
    if batch_size < 1 or n_steps < 1:
        raise AttributionError("batch_size and n_steps must be positive integers.")
    scoring = REGISTRY[method]
    wanted = None if neurons is None else _neuron_indices(neurons)
    if scoring.fit is not None and fitted is None:
        fitted = fit_method(method, model, layer, inputs, codes, ids, batch_size=batch_size,
                            seed=seed, device=device)
    if facts is not None:
        facts.fit = fitted

    def floating(x) -> None:
        if not model_io.is_floating(x):
            raise AttributionError(
                f"{method} starts from a zero baseline of the inputs themselves, which "
                f"{x.dtype} inputs (e.g. token ids) do not allow; use integrated_gradients, "
                "which starts from zero at the layer's output instead.")

    def score(batch: LayerBatch) -> torch.Tensor:
        if facts is not None and batch.start == 0:
            facts.layer.update(layer_attrs(batch.runner))
        per_row = max(1, model_io.row_size(batch.x), batch.runner.layer_size)  # a variant
        batch_codes = (None if fitted is None else
                       torch.from_numpy(codes[batch.start:batch.start + batch.rows]))
        subset = None if wanted is None else wanted.to(layer_pass.device)
        scores = scoring.function(Batch(batch.runner, batch.x, batch.targets, n_steps,
                                        first_index + batch.start, seed,
                                        max(batch.rows, per_pass // per_row), batch_codes,
                                        fitted, None if facts is None else keep_sums, subset))
        if subset is not None and scores.shape[-1] != len(subset):  # it scored every neuron
            check_neurons(wanted, scores.shape[-1])
            scores = scores.index_select(-1, subset.to(scores.device))
        scores = scores.detach()
        if scores.dtype != torch.float32 or (on_host and scores.device.type != "cpu"):
            scores = scores.to("cpu" if on_host else scores.device, torch.float32)
        return scores

    layer_pass = LayerPass(model, layer, inputs, targets, batch_size=batch_size,
                           device=device,
                           check=floating if scoring.needs_float_inputs else None,
                           cpu_layer_elements=_LAYER_ELEMENTS_PER_CHUNK)
    per_pass = _MAX_ELEMENTS_PER_PASS["cpu" if layer_pass.device.type == "cpu" else "other"]
    sums: list[PathSums] = []  # of each batch, read once, at the end

    def keep_sums(part: PathSums) -> None:
        sums.append(PathSums(part.gap.detach(), part.difference.detach(), part.steps.detach()))

    with contextlib.closing(layer_pass.run(score, progress)) as batches:
        for batch, scores in batches:
            yield batch.start, scores
    if facts is not None and sums:
        facts.sums = PathSums(*(_as_numpy(torch.cat([getattr(part, name) for part in sums]))
                                for name in ("gap", "difference", "steps")))


def _neuron_indices(neurons) -> torch.Tensor:
    """`neurons` as int64 [m], checked: sorted, no repeats, not negative (AttributionError)."""
    indices = torch.as_tensor(np.asarray(neurons), dtype=torch.int64).reshape(-1)
    if len(indices) == 0 or bool((indices < 0).any()) or bool((indices.diff() <= 0).any()):
        raise AttributionError("neurons must be indices of the layer's neurons, sorted, "
                               "without repeats, and at least one.")
    return indices


def _as_numpy(values: torch.Tensor) -> np.ndarray:
    """`values` as a NumPy array; half-precision floats (bfloat16 has no NumPy dtype) as
    float32."""
    if values.is_floating_point() and values.dtype not in (torch.float32, torch.float64):
        values = values.float()
    return values.cpu().numpy()


def fit_method(method: str, model: nn.Module, layer, inputs: Inputs,
               codes: Optional[np.ndarray], ids: Optional[pd.Index], *,
               batch_size: int = DEFAULT_BATCH_SIZE, seed: int = DEFAULT_SEED, device=None):
    """The pre-pass of a method fitted to clusters (`Method.fit`) on all of `inputs`, whose
    cluster indices are `codes` [N] among `ids`; None for any other method. Refuses missing
    clusters, and a single cluster (nothing to tell apart)."""
    check_method(method)
    fit = REGISTRY[method].fit
    if fit is None:
        return None
    if codes is None:
        raise AttributionError(
            f"{method} is fitted to the clusters (it scores the neurons that tell them "
            "apart), so it needs them: pass clusters= (one id per sample), or --clusters on "
            "the command line.")
    if len(ids) < 2:
        raise AttributionError(
            f"{method} tells clusters apart, and these samples form one cluster "
            f"({ids[0]}): it is fitted to a grouping of the samples into two or more "
            "clusters (the label, the predicted class, k-means; on the command line "
            "--clusters, and --cluster for the one whose neurons are ranked).")
    return fit(model, layer, inputs, codes, ids, batch_size=batch_size, seed=seed,
               device=device)


def scored_layer(model: nn.Module, layer, inputs: Inputs, device=None) -> dict[str, object]:
    """`runners.layer_attrs` of `layer` as every score of it on `inputs` sees it (its neuron
    axis), from the first sample (runners are cached: free after a computation). Reads
    one sample, so a one-shot iterator loses it."""
    facts = ScoreFacts()
    batches = score_batches(model, layer, inputs, None, "activation", batch_size=1,
                            device=device, facts=facts)
    next(batches, None)
    batches.close()
    return facts.layer


def neuron_scores(model: nn.Module, layer, inputs: Inputs, targets: Targets = None,
                  method: str = DEFAULT_METHOD, *, batch_size: int = DEFAULT_BATCH_SIZE,
                  n_steps: int = DEFAULT_N_STEPS, progress: Progress = None,
                  seed: int = DEFAULT_SEED, device=None, clusters: Optional[Sequence] = None,
                  facts: Optional[ScoreFacts] = None,
                  neurons: Optional[Sequence[int]] = None
                  ) -> torch.Tensor:
    """Per-sample neuron scores for one layer.

    Args:
        model: a classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name (as in `model.named_modules()`) or the module itself.
        inputs: [N, ...] tensor or array (a memory-mapped .npy streams batch by batch), or an
            iterable of batches (a DataLoader) yielding x [B, ...] or (x, y, ...) tuples.
        targets: LongTensor [N] of class ids (in iteration order), None (predicted class),
            "all", or "labels": the y [B] of each (x, y) batch of an iterable, so a
            DataLoader's labels need not be gathered first.
        method: one of `method_names()`.
        batch_size: samples per pass for array inputs (an iterable keeps its own batches);
            results do not depend on it.
        n_steps: integration steps for integrated_gradients and conductance.
        progress: called with the fraction done after each batch; may raise to stop.
        seed: seed of the `random` method.
        device: where to compute ("cpu", "cuda", "cuda:1"); None = where the model is. A model
            elsewhere is copied there for the call, never moved.
        clusters: one id per sample [N]; needed by a method fitted to clusters (`probe`),
            whose score of a sample is then its cluster's. Other methods ignore it.
        facts: a `ScoreFacts` that receives what the scoring learns beside its scores:
            the layer's neuron axis, a fitted method's fit (its note, e.g. a probe's
            accuracy, and whether its scores rank anything), a path method's sums per
            sample (`paths.sum_check` reads them).
        neurons: indices of the layer's neurons to score (sorted, no repeats); None = all.
            Exact ablation then runs one masked pass per neuron given, not per neuron.
    Returns:
        float32 CPU tensor [N, n_neurons], or [N, n_classes, n_neurons] for targets="all";
        [..., m] with m `neurons`.
    """
    codes, ids = ((None, None) if clusters is None or REGISTRY.get(method) is None
                  or REGISTRY[method].fit is None
                  else cluster_codes(clusters, n_samples(inputs)))
    batches = score_batches(model, layer, inputs, targets, method, batch_size=batch_size,
                            n_steps=n_steps, progress=progress, seed=seed, device=device,
                            on_host=False,  # a GPU's scores come back once, at the end
                            facts=facts, codes=codes, ids=ids, neurons=neurons)
    with contextlib.closing(batches):  # a failure here still restores the model at once
        if not model_io.is_batch(model_io.named(inputs)):  # an iterable: N known at the end
            return torch.cat([scores for _, scores in batches]).cpu()
        result = None  # written batch by batch: no second copy of every score at the end
        for start, scores in batches:
            if result is None:
                shape = (n_samples(inputs), *scores.shape[1:])
                result = (empty_table(shape) if scores.device.type == "cpu"
                          else scores.new_empty(shape))
            result[start:start + scores.shape[0]] = scores
        return result.cpu()


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


def averaged(per_sample: np.ndarray, reduce: str) -> np.ndarray:
    """The per-sample quantity that `reduce` summarises: |s| for "mean_abs", else s."""
    return np.abs(per_sample) if reduce == "mean_abs" else per_sample


def reduce_scores(scores, reduce: str, clusters: Optional[Sequence] = None):
    """The reduce rule, the one place it is written: a cluster's score of a neuron is the
    mean of its samples' scores s ("mean"), the mean of |s| ("mean_abs"), or their sample
    standard deviation ("std": ddof=1, NaN for a single sample).

    Args:
        scores: per-sample scores [m, ...] (an array, summarised over its first axis), or a
            `ClusterStatistics` (the sums streamed per cluster).
        reduce: one of `REDUCTIONS`.
        clusters: with per-sample scores [N, n], one cluster id per sample: a row per cluster.
    Returns:
        - per-sample scores: ndarray [...] in their own dtype;
        - per-sample scores and clusters: DataFrame with index "cluster" (sorted), columns
          0..n-1 (float64) and "n" (cluster size), as `cluster_scores`;
        - a ClusterStatistics: float64 tensor [G, ...], one row per cluster.
    """
    check_reduce(reduce)
    if isinstance(scores, ClusterStatistics):
        sizes = scores.counts.view((-1,) + (1,) * (scores.sums.dim() - 1))
        if reduce == "std":
            variance = (scores.sums_sq - scores.sums * scores.sums / sizes) / (sizes - 1)
            return variance.clamp_min(0).sqrt()
        return (scores.sums_abs if reduce == "mean_abs" else scores.sums) / sizes
    values = averaged(scores, reduce)
    if clusters is not None:
        frame = pd.DataFrame(values.astype(np.float64), columns=range(scores.shape[1]),
                             copy=False)  # a fresh array already; copying it was half the time
        groups = frame.groupby(np.asarray(clusters), sort=True)
        table = groups.std(ddof=1) if reduce == "std" else groups.mean()
        table.index.name = "cluster"
        table["n"] = groups.size().astype(np.int64)
        return table
    if reduce == "std":
        return (values.std(0, ddof=1) if values.shape[0] > 1
                else np.full(values.shape[1:], np.nan))
    return values.mean(0)


@dataclass
class ClusterStatistics:
    """Running per-cluster sums of scores: every reduction follows, and shards add up.

    Attributes:
        ids: the G cluster ids.
        counts: float64 [G], samples seen per cluster.
        sums, sums_abs, sums_sq: float64 [G, n] (or [G, n_classes, n]) sums of s, |s|, s*s.
        layer: `runners.layer_attrs` of the layer scored (and a fitted method's
            `ScoreFacts.fit_attrs`), copied to the frame's attrs.
        sum_counts: for a path method (`Method.sums_to`), float64 [G, 3]: per cluster, the
            samples whose sum was checked, those that took more steps than asked, and those
            whose scores still miss it (`SUM_COLUMNS`); None for other methods. Shards add up.
    """

    ids: pd.Index
    counts: torch.Tensor
    sums: torch.Tensor
    sums_abs: torch.Tensor
    sums_sq: torch.Tensor
    layer: dict = field(default_factory=dict)
    sum_counts: Optional[torch.Tensor] = None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The summable tensors (for an all_reduce across processes)."""
        return self.counts, self.sums, self.sums_abs, self.sums_sq

    def frame(self, reduce: str = DEFAULT_REDUCE) -> pd.DataFrame:
        """The `cluster_scores` table for `reduce` ("mean", "mean_abs" or "std")."""
        table = reduce_scores(self, reduce)
        frame = _cluster_frame(table.numpy(), self.ids, self.counts.numpy())
        frame.attrs.update(self.layer)
        return frame


def cluster_statistics(model: nn.Module, layer, inputs: Inputs, targets: Targets,
                       codes: np.ndarray, ids: pd.Index, method: str = DEFAULT_METHOD, *,
                       batch_size: int = DEFAULT_BATCH_SIZE, n_steps: int = DEFAULT_N_STEPS,
                       progress: Progress = None, seed: int = DEFAULT_SEED, device=None,
                       first_index: int = 0,
                       on_batch: Optional[Callable[[int, torch.Tensor], object]] = None,
                       fitted=None) -> ClusterStatistics:
    """Stream the scores of `inputs` into per-cluster sums: memory O(clusters x neurons).

    Args:
        codes: int64 [N], the cluster index (0..G-1) of each input (see `cluster_codes`).
        ids: the G cluster ids.
        first_index: dataset index of the first input (see `score_batches`).
        on_batch: called with (start, scores [B, ...]) of every batch, e.g. to write the
            per-sample scores to disk in the same pass.
        fitted: a method fitted to clusters, already fitted to these ids on all the data
            (`fit_method`; a shard of it is scored here); None fits it on `inputs`.
        Other arguments as in `neuron_scores`.
    """
    counts = torch.zeros(len(ids), dtype=torch.float64)
    sums = sums_abs = sums_sq = None
    facts = ScoreFacts()
    for start, scores in score_batches(model, layer, inputs, targets, method,
                                       batch_size=batch_size, n_steps=n_steps,
                                       progress=progress, seed=seed, device=device,
                                       first_index=first_index, facts=facts,
                                       codes=codes, ids=ids, fitted=fitted):
        if start + scores.shape[0] > len(codes):
            raise AttributionError("There are more samples than cluster ids.")
        index = torch.from_numpy(codes[start:start + scores.shape[0]])
        values = scores.double()
        if sums is None:
            sums, sums_abs, sums_sq = (torch.zeros((len(ids),) + values.shape[1:],
                                                   dtype=torch.float64) for _ in range(3))
        # index_put_ with accumulate: index_add_ is far slower when every index is equal
        counts.index_put_((index,), torch.ones(len(index), dtype=torch.float64), accumulate=True)
        sums.index_put_((index,), values, accumulate=True)
        sums_abs.index_put_((index,), values.abs(), accumulate=True)
        sums_sq.index_put_((index,), values * values, accumulate=True)
        if on_batch is not None:
            on_batch(start, scores)
    sum_counts = None if facts.sums is None else \
        _sum_counts(facts.sums, codes, len(ids), n_steps)  # per sample: counted instead
    return ClusterStatistics(ids, counts, sums, sums_abs, sums_sq,
                             {**facts.layer, **facts.fit_attrs()}, sum_counts)


SUM_COLUMNS = ("sum_checked", "sum_refined", "sum_missing")
"""The columns of `ClusterStatistics.sum_counts`."""


def _sum_counts(sums: PathSums, codes: np.ndarray, n_clusters: int, n_steps: int
                ) -> torch.Tensor:
    """float64 [G, 3] (`SUM_COLUMNS`) from the per-sample `sums` of the first len(...)
    samples, whose cluster indices are `codes`."""
    share = sums.shares()
    index = codes[:len(share)]
    columns = (~np.isnan(share), np.asarray(sums.steps) > n_steps,
               np.nan_to_num(share) > SUM_TOLERANCE)
    return torch.from_numpy(np.stack([np.bincount(index, weights=column.astype(np.float64),
                                                   minlength=n_clusters)
                                      for column in columns], axis=1))


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
        say which axis of the layer's output the neurons are (`runners.layer_attrs`).
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
    return reduce_scores(per_sample, reduce, clusters)

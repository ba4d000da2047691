"""Scores across processes with torch.distributed: each rank scores one shard, sums are reduced.

Every rank calls the same function with the same inputs (a tensor, an array, a memory-mapped
.npy, an `NpyRows`, a DataLoader or any iterable of batches), targets and cluster ids. Each
rank scores only its own contiguous shard; the streaming statistics (per-cluster counts, sums,
sums of |s| and of squares) are summed with `all_reduce`, so every rank returns what one
process would have computed, and rank 0 writes. Without a process group (or with one process)
the same functions simply run in this process. Targets and cluster ids follow the iteration
order, so an iterable must yield the same batches in the same order on every rank (a
DataLoader with shuffle=False).

    torchrun --nproc_per_node=4 -m attribution score --model m.pt2 --data x.npy ...
    # or, inside an existing job after torch.distributed.init_process_group(...):
    table = attribution.analyses.distributed.cluster_scores(model, "fc2", x, y, clusters)
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, SequentialSampler, Subset

from ..engine import model_io
from . import pruning_curves
from ..errors import AttributionError
from ..methods.passes import on_device
from ..defaults import (DEFAULT_ABLATION, DEFAULT_BATCH_SIZE, DEFAULT_METHOD, DEFAULT_METRIC,
                        DEFAULT_N_RANDOM, DEFAULT_N_STEPS, DEFAULT_REDUCE, DEFAULT_SEED)
from ..methods.registry import REGISTRY
from ..methods.scores import (SUM_COLUMNS, ClusterStatistics, Inputs, Progress, Targets,
                              cluster_codes, find_cluster, cluster_statistics as shard_statistics,
                              fit_method, n_samples)
from ..engine.processes import rank_and_size
from ..engine.runners import LAYER_KEYS


def shard_range(total: int, rank: int, size: int) -> range:
    """Rank `rank`'s contiguous share of `total` samples; shares differ by at most one."""
    base, extra = divmod(total, size)
    begin = rank * base + min(rank, extra)
    return range(begin, begin + base + (rank < extra))


@dataclass
class Shard:
    """A piece of the data that this rank scores.

    Attributes:
        inputs: what the engine scores (an array slice, a DataLoader, or [one batch]).
        first_index: dataset index of its first sample.
        size: its number of samples; None = all that remain (one process, size unknown).
    """

    inputs: Inputs
    first_index: int
    size: Optional[int]

    def rows(self) -> slice:
        """Its rows of per-sample arrays of the whole dataset (targets, cluster codes)."""
        return slice(self.first_index, None if self.size is None
                     else self.first_index + self.size)


def shards(inputs: Inputs, rank: int, size: int) -> Iterator[Shard]:
    """This rank's pieces of `inputs`.

    Arrays, tensors, named inputs and `NpyRows` are sliced lazily into one contiguous range
    per rank; a DataLoader over a map-style dataset read in order gets a DataLoader over its
    range; any other iterable is dealt out batch by batch (every rank reads every batch, and scores
    batches rank, rank + size, ...).
    """
    inputs = model_io.named(inputs)
    total = n_samples(inputs)
    if size == 1:
        yield Shard(inputs, 0, total)
        return
    if hasattr(inputs, "shape") or _splittable_loader(inputs):
        share = shard_range(total, rank, size)
        if len(share):
            part = (inputs[share.start:share.stop] if hasattr(inputs, "shape")
                    else _loader_over(inputs, share))
            yield Shard(part, share.start, len(share))
        return
    if isinstance(inputs, DataLoader) and not isinstance(inputs.sampler, SequentialSampler) \
            and not isinstance(inputs.dataset, IterableDataset):
        raise AttributionError("A shuffled DataLoader gives each process its own order, so "
                               "targets and cluster ids would not line up: use shuffle=False.")
    first_index = 0
    for number, item in enumerate(inputs):
        batch_size = model_io.n_rows(model_io.named(
            item[0] if isinstance(item, (tuple, list)) else item))
        if number % size == rank:
            yield Shard([item], first_index, batch_size)
        first_index += batch_size


def _splittable_loader(inputs) -> bool:
    return (isinstance(inputs, DataLoader) and not isinstance(inputs.dataset, IterableDataset)
            and isinstance(inputs.sampler, SequentialSampler) and inputs.batch_size is not None
            and not inputs.drop_last)


def _loader_over(loader: DataLoader, share: range) -> DataLoader:
    return DataLoader(Subset(loader.dataset, share), batch_size=loader.batch_size,
                      num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                      pin_memory=loader.pin_memory)


def _targets_of(targets: Targets, shard: Shard) -> Targets:
    if isinstance(targets, torch.Tensor):
        if shard.size is not None and shard.first_index + shard.size > targets.shape[0]:
            raise AttributionError("There are more samples than targets.")
        return targets[shard.rows()]
    return targets


def _ok_everywhere(error: Optional[BaseException], group) -> None:
    """Raise on every rank when any rank failed (so no rank waits forever for the others)."""
    failed = torch.tensor([float(error is not None)], device=_reduce_device(group))
    if rank_and_size(group)[1] > 1:
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=group)
    if error is not None:
        raise error
    if failed.item():
        raise AttributionError("Another process failed (its message says why); stopping.")


def _reduce_device(group) -> torch.device:
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _added(one: Optional[torch.Tensor], other: Optional[torch.Tensor]
           ) -> Optional[torch.Tensor]:
    """The sum of two shards' counts, either of which may be None (not counted)."""
    return other if one is None else one if other is None else one + other


def all_reduce_sum(tensors: list[torch.Tensor], group=None) -> list[torch.Tensor]:
    """Element-wise sums of `tensors` over all ranks (the inputs are left as they were)."""
    if rank_and_size(group)[1] == 1:
        return tensors
    device = _reduce_device(group)
    summed = []
    for tensor in tensors:
        on_reduce_device = tensor.to(device, copy=True)
        dist.all_reduce(on_reduce_device, group=group)
        summed.append(on_reduce_device.to(tensor.device))
    return summed


def _shape_everywhere(shape: Optional[tuple[int, ...]], group) -> tuple[int, ...]:
    """The trailing shape of the scores, also on ranks that had no samples."""
    known = torch.full((4,), -1.0, device=_reduce_device(group))
    if shape is not None:
        known[0] = len(shape)
        known[1:1 + len(shape)] = torch.tensor(shape, dtype=torch.float32)
    if rank_and_size(group)[1] > 1:
        dist.all_reduce(known, op=dist.ReduceOp.MAX, group=group)
    if known[0] < 0:
        raise AttributionError("There are no samples to score (the inputs are empty).")
    return tuple(int(d) for d in known[1:1 + int(known[0])].tolist())


def cluster_statistics(model: nn.Module, layer, inputs: Inputs, targets: Targets, clusters,
                       method: str = DEFAULT_METHOD, *, batch_size: int = DEFAULT_BATCH_SIZE,
                       n_steps: int = DEFAULT_N_STEPS, progress: Progress = None,
                       seed: int = DEFAULT_SEED, device=None, per_sample=None,
                       group=None) -> ClusterStatistics:
    """Per-cluster sums over all ranks' shards (every rank gets the totals).

    Args:
        inputs, targets, clusters: the whole dataset, identical on every rank (targets a
            LongTensor [N], None, "all" or "labels"; clusters [N] ids).
        per_sample: a path: also write the per-sample scores [N, n] (or [N, n_classes, n])
            there as a float32 .npy, in the same pass and batch by batch (memory stays one
            batch). Each rank writes `<path>.part<rank>` and rank 0 joins the parts in order,
            so with several machines the path must be on a filesystem every rank sees.
        group: the process group; None = the default group, or one process when there is none.
        Other arguments as in `attribution.neuron_scores`; `progress` gets this rank's fraction.
    Returns:
        `ClusterStatistics` whose `frame(reduce)` is the `cluster_scores` table.
    """
    rank, size = rank_and_size(group)
    codes, ids = cluster_codes(clusters, n_samples(inputs))
    part_path = None if per_sample is None else _part(Path(per_sample), rank)
    statistics, error = None, None
    try:
        model = on_device(model, device)
        # a method fitted to clusters is fitted once on all the data (every rank alike)
        fitted = fit_method(method, model, layer, inputs, codes, ids, batch_size=batch_size,
                            seed=seed)
        with _PerSampleWriter(part_path) as write:
            for shard in shards(inputs, rank, size):
                part = shard_statistics(
                    model, layer, shard.inputs, _targets_of(targets, shard),
                    codes[shard.rows()], ids, method, batch_size=batch_size, n_steps=n_steps,
                    progress=progress, seed=seed, first_index=shard.first_index,
                    on_batch=write, fitted=fitted)
                statistics = part if statistics is None else ClusterStatistics(
                    ids, *(a + b for a, b in zip(statistics.tensors(), part.tensors())),
                    part.layer, _added(statistics.sum_counts, part.sum_counts))
    except Exception as caught:  # every rank must learn of it, or the others wait forever
        error = caught
        if part_path is not None:
            part_path.unlink(missing_ok=True)
    _ok_everywhere(error, group)
    trailing = _shape_everywhere(None if statistics is None
                                 else tuple(statistics.sums.shape[1:]), group)
    if statistics is None:
        zeros = torch.zeros((len(ids),) + trailing, dtype=torch.float64)
        statistics = ClusterStatistics(ids, torch.zeros(len(ids), dtype=torch.float64),
                                       zeros, zeros.clone(), zeros.clone())
    sum_counts = None  # a path method's sum check, counted on every rank (zeros: no shard)
    if REGISTRY[method].sums_to is not None:
        sum_counts = (statistics.sum_counts if statistics.sum_counts is not None
                      else torch.zeros((len(ids), len(SUM_COLUMNS)), dtype=torch.float64))
    totals = all_reduce_sum(list(statistics.tensors())
                            + ([sum_counts] if sum_counts is not None else []), group)
    statistics = ClusterStatistics(ids, *totals[:4], statistics.layer,
                                   totals[4] if sum_counts is not None else None)
    if per_sample is not None:
        shape = (int(statistics.counts.sum().item()),) + trailing
        error = None
        if rank == 0:
            try:
                _join_parts(Path(per_sample), shape,
                            [_part(Path(per_sample), r) for r in range(size)])
            except OSError as caught:
                error = AttributionError(
                    f"Cannot assemble {per_sample} from the per-rank parts ({caught}); with "
                    "several machines, write to a filesystem that every rank sees.")
        _ok_everywhere(error, group)
    return statistics


def cluster_scores(model: nn.Module, layer, inputs: Inputs, targets: Targets, clusters,
                   method: str = DEFAULT_METHOD, *, reduce: str = DEFAULT_REDUCE,
                   batch_size: int = DEFAULT_BATCH_SIZE, n_steps: int = DEFAULT_N_STEPS,
                   progress: Progress = None, seed: int = DEFAULT_SEED, device=None,
                   group=None) -> pd.DataFrame:
    """`attribution.cluster_scores`, sharded over the ranks of `group`; every rank gets it.

    Arguments as in `cluster_statistics`; `reduce` in "mean", "mean_abs", "std".
    """
    return cluster_statistics(model, layer, inputs, targets, clusters, method,
                              batch_size=batch_size, n_steps=n_steps, progress=progress,
                              seed=seed, device=device, group=group).frame(reduce)


def _part(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.name}.part{rank}")


class _PerSampleWriter:
    """Appends each batch's scores as raw float32 rows to a part file (or does nothing)."""

    def __init__(self, path: Optional[Path]):
        self.path, self.file = path, None

    def __enter__(self):
        if self.path is None:
            return None
        try:
            self.file = open(self.path, "wb")
        except OSError as error:
            raise AttributionError(f"Cannot write {self.path}: {error.strerror}.") from None
        return self

    def __call__(self, start: int, scores: torch.Tensor) -> None:
        try:
            self.file.write(scores.numpy().tobytes())
        except OSError as error:
            raise AttributionError(f"Cannot write {self.path}: {error.strerror}.") from None

    def __exit__(self, *exc_info) -> None:
        if self.file is not None:
            self.file.close()


def _join_parts(path: Path, shape: tuple[int, ...], parts: list[Path]) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
              "fortran_order": False, "shape": shape}
    with open(path, "wb") as joined:
        np.lib.format.write_array_header_2_0(joined, header)
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, joined, 1 << 20)
            part.unlink()


def pruning_curve(model: nn.Module, layer, inputs: Inputs, targets, scores, *, ks=None,
                  n_random: int = DEFAULT_N_RANDOM, seed: int = DEFAULT_SEED,
                  ablation: str = DEFAULT_ABLATION, metric: Optional[str] = None,
                  batch_size: int = DEFAULT_BATCH_SIZE, progress=None, device=None,
                  group=None) -> pd.DataFrame:
    """`attribution.pruning_curve`, sharded over the ranks of `group`; every rank gets it.

    Each rank measures its shard; the per-k metric sums of the ranked, bottom and every
    random order are all-reduced, so the band's percentiles come from the pooled curves.
    `ablation="mean"` needs the layer's mean over all the data and runs in one process
    only. `progress(fraction, partial_frame)` reports this rank's shard.
    """
    return _pooled_curves(model, layer, inputs, targets, scores, None, dict(
        ks=ks, n_random=n_random, seed=seed, ablation=ablation, metric=metric,
        batch_size=batch_size, progress=progress), device, group)


def cluster_pruning_curves(model: nn.Module, layer, inputs: Inputs, targets, clusters,
                           cluster, scores, *, ks=None, n_random: int = DEFAULT_N_RANDOM,
                           seed: int = DEFAULT_SEED, ablation: str = DEFAULT_ABLATION,
                           metric: Optional[str] = None, batch_size: int = DEFAULT_BATCH_SIZE,
                           progress=None, device=None, group=None) -> pd.DataFrame:
    """`attribution.cluster_pruning_curves` (subsets "cluster" and "rest"), sharded over the
    ranks of `group`; arguments and limits as in `pruning_curve` here."""
    codes, ids = cluster_codes(clusters, n_samples(inputs))
    in_cluster = codes == ids.get_loc(find_cluster(cluster, ids))
    return _pooled_curves(model, layer, inputs, targets, scores, in_cluster, dict(
        ks=ks, n_random=n_random, seed=seed, ablation=ablation, metric=metric,
        batch_size=batch_size, progress=progress), device, group)


_SUBSETS = ("cluster", "rest")


def _pooled_curves(model, layer, inputs, targets, scores, in_cluster, options, device, group):
    """Sum every rank's per-subset curve sums [G, 2 + n_random, K] and build one frame."""
    rank, size = rank_and_size(group)
    if size > 1 and options["ablation"] == "mean":
        raise AttributionError("ablation='mean' replaces a neuron by its mean over all the "
                               "data, which one process computes; run it without torchrun, "
                               "or use ablation='zero'.")
    n_groups = 1 if in_cluster is None else 2
    sums, counts, n_neurons, ks, error = None, np.zeros(n_groups), None, None, None
    layer_attrs: dict = {}  # `runners.layer_attrs`, from this rank's shards (none: empty)
    metric = options["metric"] or DEFAULT_METRIC  # a rank without shards cannot tell
    try:
        model = on_device(model, device)
        for shard in shards(inputs, rank, size):
            for piece in _shard_curves(model, layer, shard, targets, scores, in_cluster,
                                       options):
                if sums is None:
                    sums = np.zeros((n_groups,) + piece.sums.shape)
                sums[piece.group] += piece.sums
                counts[piece.group] += piece.n
                n_neurons, ks, layer_attrs = piece.n_neurons, piece.ks, piece.layer
                metric = piece.metric
    except Exception as caught:  # every rank must learn of it, or the others wait forever
        error = caught
    _ok_everywhere(error, group)
    n_orders, n_ks, n_neurons = _shape_everywhere(
        None if sums is None else sums.shape[1:] + (n_neurons,), group)
    if sums is None:
        sums = np.zeros((n_groups, n_orders, n_ks))
        ks = pruning_curves.check_ks(options["ks"], n_neurons)
    sums, counts = all_reduce_sum([torch.from_numpy(sums), torch.from_numpy(counts)], group)
    orders = torch.cat([torch.zeros(2, n_neurons, dtype=torch.long),  # ranked, bottom: unused
                        pruning_curves.random_orders(n_neurons, options["n_random"],
                                                     options["seed"])])
    return pruning_curves.curve_frame(  # the frame one process builds, from the pooled sums
        sums.permute(1, 2, 0), counts.numpy().astype(np.int64), ks, list(range(n_ks)),
        None if in_cluster is None else _SUBSETS, orders, metric,
        options["ablation"], options["n_random"], options["seed"], layer_attrs)


@dataclass
class _CurveSums:
    """One subset's curves on one shard: sums [2 + n_random, K] of ranked, bottom, draws."""

    group: int
    sums: np.ndarray
    n: int
    ks: list
    n_neurons: int
    layer: dict  # `runners.layer_attrs`
    metric: str  # the metric measured (a None asked for: the head's own)


def _shard_curves(model, layer, shard: Shard, targets, scores, in_cluster,
                  options) -> Iterator[_CurveSums]:
    shard_targets = _targets_of(targets, shard)
    member = None if in_cluster is None else in_cluster[shard.rows()]
    if member is None or member.all() or not member.any():
        frame = pruning_curves.pruning_curve(model, layer, shard.inputs, shard_targets, scores,
                                      **options)
        parts = [(0 if member is None or member.all() else 1, frame, frame.attrs["n_samples"],
                  frame.attrs["random_curves"])]
    else:
        frame = pruning_curves.cluster_pruning_curves(model, layer, shard.inputs, shard_targets,
                                               member, True, scores, **options)
        parts = [(group, frame[frame["subset"] == subset], frame.attrs["n_samples"][subset],
                  frame.attrs["random_curves"][subset]) for group, subset in enumerate(_SUBSETS)]
    for group, part, n, draws in parts:
        sums = n * np.vstack([part["ranked"], part["bottom"], np.asarray(draws)])
        yield _CurveSums(group, sums, n, part["k"].tolist(), frame.attrs["n_neurons"],
                         {key: frame.attrs[key] for key in LAYER_KEYS}, frame.attrs["metric"])

"""Pruning curves: how a model's metric moves as a layer's neurons are removed in score order.

Removal is cumulative. The point at k has removed the k highest-scored neurons ("ranked"), the
k lowest-scored ("bottom"), or the first k of each of `n_random` seeded random orders (the
random band: mean and 5th/95th percentiles). Ties in the scores keep neuron order.

Removing a neuron sets its output to 0 (`ablation="zero"`) or to its mean over the inputs
given (`ablation="mean"`). For a conv layer the whole channel is replaced: by 0, or by its
mean map (the mean over samples at each position, [H, W]), so position-dependent structure
such as padding borders survives the ablation. A sequence layer under an attention mask takes
the mean over the samples whose token at that position is real (padding counts for none).

Speed: the layer output z is captured once per batch; many masked variants of z then go
through `LayerRunner.tail` in one stacked pass, so only the part of the network after the
layer re-runs when torch.fx can split the model. Identical masks (k=0, k=n) run once. On a
CPU a batch with a large layer output (a wide sequence layer) is captured in row chunks.
Captured outputs stay in memory between refinement rounds while they fit in `_CACHE_BYTES`;
otherwise every round reads the inputs again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn import functional

from ..errors import AttributionError
from ..defaults import (DEFAULT_ABLATION, DEFAULT_BATCH_SIZE, DEFAULT_METRIC, DEFAULT_N_RANDOM,
                        DEFAULT_SEED)
from ..engine.guards import eval_mode
from ..engine.layers import run_logits
from ..engine.model_io import NamedInputs, attention_mask, named, take, to_model
from ..methods.passes import (Inputs, LayerBatch, LayerPass, model_device, n_samples,
                              pass_modes)
from ..methods.scores import cluster_codes, find_cluster
from ..engine.runners import layer_attrs

ABLATIONS = ("zero", "mean")
METRICS = ("accuracy", "target_logit", "loss", "squared_error")
CLASSIFIER_METRICS = ("accuracy", "loss")
"""The metrics that need classes: a regression head (one output) has none."""
HIGHER_IS_WORSE = ("loss", "squared_error")
"""The metrics that removing important neurons raises (the others it lowers)."""
CURVE_COLUMNS = ("k", "ranked", "bottom", "random_mean", "random_lo", "random_hi")
BAND_PERCENTILES = (5.0, 95.0)
_CACHE_BYTES = 512 << 20
# Layer-output elements per stacked tail pass. On a CPU a pass that fits in cache (1 MiB of
# float32) is faster than one huge pass (benchmarks/bench_pruning.py);
# a GPU wants big passes to amortise kernel launches.
_ELEMENTS_PER_PASS = {"cpu": 1 << 18, "other": 1 << 24}
# Samples per capture on a CPU: a batch whose layer output has more elements (16 MiB of float32)
# is captured in row chunks. Bigger blocks are mapped fresh and page-faulted in on every masked
# pass, smaller ones the allocator reuses (a GPT-2 MLP layer's curve had spent a large share
# of its CPU time in page faults). A GPU's
# caching allocator needs no split.
_CPU_ELEMENTS_PER_CAPTURE = 1 << 22
_FIRST_ROUND = 5  # k points in the first progress update: both ends, the middle, the quarters

CurveProgress = Optional[Callable[[float, pd.DataFrame], object]]


def pruning_curve(model: nn.Module, layer, inputs: Inputs, targets, scores, *,
                  ks: Optional[Sequence[int]] = None, n_random: int = DEFAULT_N_RANDOM,
                  seed: int = DEFAULT_SEED, ablation: str = DEFAULT_ABLATION,
                  metric: Optional[str] = None, batch_size: int = DEFAULT_BATCH_SIZE,
                  progress: CurveProgress = None, resume: Optional[pd.DataFrame] = None,
                  device=None) -> pd.DataFrame:
    """The metric after removing k neurons in descending score order, against bottom-k and random.

    Args:
        model: classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name or the module itself.
        inputs: [N, ...] tensor or array, or a re-iterable of batches (DataLoader).
        targets: LongTensor [N] of class ids, None (the unpruned model's predicted class,
            so "accuracy" is agreement with the unpruned model), or "labels" (the y of each
            (x, y) batch of an iterable); for "squared_error", the true values [N] (floats).
        scores: one value per neuron [n_neurons] (array, tensor, or a row of `cluster_scores`,
            whose column "n" is ignored). Higher = more important = removed first.
        ks: the k values to evaluate (0..n_neurons); None = every k (for a layer of thousands
            of neurons pass a subset, e.g. np.linspace(0, n, 65).round()).
        n_random: number of seeded random orders forming the band (>= 1).
        seed: seed of the random orders; same seed, same curve.
        ablation: "zero" or "mean" (see module docstring).
        metric: "accuracy", "target_logit" (mean target logit) or "loss" (mean cross-entropy)
            for a classifier; for a regression head (one output) "target_logit" (the mean
            output) or "squared_error" (the mean of (output - true value)^2).
        batch_size: samples per captured batch; results do not depend on it.
        progress: called as progress(fraction, partial_frame) after each refinement round; the
            first round covers the whole k range coarsely. May raise to stop.
        resume: a partial frame that `progress` received from an interrupted call with the
            same arguments: its k values are not computed again (AttributionError when it
            belongs to other scores, orders, metric or samples).
        device: where to compute ("cpu", "cuda"); None = where the model is (never moved).
    Returns:
        DataFrame with columns `CURVE_COLUMNS`, one row per k (ascending). `attrs` holds
        metric, ablation, n_neurons, n_samples, n_random, seed, random_orders [n_random,
        n_neurons] and random_curves [n_random, len(ks)] (for `curve_summary`); the last two
        are nested lists, not arrays, so that pd.concat of curve frames keeps working; and
        layer, neuron_axis, axis_rule (`runners.layer_attrs`).
    """
    return _curves(model, layer, inputs, targets, scores, None, None, ks=ks,
                   n_random=n_random, seed=seed, ablation=ablation, metric=metric,
                   batch_size=batch_size, progress=progress, resume=resume, device=device)


def cluster_pruning_curves(model: nn.Module, layer, inputs: Inputs, targets, clusters,
                           cluster, scores, *, ks: Optional[Sequence[int]] = None,
                           n_random: int = DEFAULT_N_RANDOM, seed: int = DEFAULT_SEED,
                           ablation: str = DEFAULT_ABLATION, metric: Optional[str] = None,
                           batch_size: int = DEFAULT_BATCH_SIZE, progress: CurveProgress = None,
                           resume: Optional[pd.DataFrame] = None, device=None) -> pd.DataFrame:
    """Pruning curves of one ranking on a cluster and on the rest of the data, in one pass.

    Both subsets share the masks, the random orders and (for "mean") the mean over all
    inputs, so the two curves differ only in which samples are measured: a ranking whose
    top neurons are specific to the cluster hurts the cluster more than the rest.

    Args:
        clusters: 1-D array of cluster ids [N], one per sample.
        cluster: the id whose samples form subset "cluster"; all others form "rest".
        Other arguments as in `pruning_curve`.
    Returns:
        Tidy DataFrame with columns ("subset", *CURVE_COLUMNS); subset is "cluster" or
        "rest" (omitted when the cluster holds every sample). `attrs` as in `pruning_curve`,
        with n_samples and random_curves keyed by subset.
    """
    codes, ids = cluster_codes(clusters, n_samples(inputs))
    in_cluster = codes == ids.get_loc(find_cluster(cluster, ids))
    groups = np.where(in_cluster, 0, 1)
    return _curves(model, layer, inputs, targets, scores, groups, ("cluster", "rest"), ks=ks,
                   n_random=n_random, seed=seed, ablation=ablation, metric=metric,
                   batch_size=batch_size, progress=progress, resume=resume, device=device)


def curve_summary(curves: pd.DataFrame, metric: Optional[str] = None) -> pd.DataFrame:
    """Areas under the curves and how the ranking compares with the random orders.

    Areas are trapezoids over k divided by the k range, i.e. the metric's mean over k (the
    value itself when there is one k). "Damage" means a lower accuracy or target logit, or a
    higher loss.

    Args:
        curves: a frame from `pruning_curve` or `cluster_pruning_curves`.
        metric: the curves' metric; None reads it from `curves.attrs`.
    Returns:
        DataFrame indexed by "subset" ("all" for a single curve) with columns area_ranked,
        area_bottom, area_random (area of random_mean), gap_vs_random (area between the random
        mean and the ranked curve; positive = the ranking does more damage than random), and
        fraction_random_beaten (share of random orders whose area the ranking beats, ties
        count half; NaN when `curves.attrs` lacks the random curves of its rows, e.g. after a
        CSV round-trip or a slice of rows), and p_value: the permutation test of "the
        ranking does no more damage than a random order", (1 + orders doing at least as
        much damage, ties half) / (n_random + 1): a random ranking is one more random order,
        so its p_value is uniform; the smallest possible is 1 / (n_random + 1) (NaN as for
        fraction_random_beaten); and outside_band: the share of the k strictly between 0
        and n at which the ranked curve lies beyond the random band's damaging end (below
        random_lo, or above random_hi for a loss; NaN without such k). A ranking whose
        curve never leaves the band is not said to beat random, whatever its area.
    """
    metric = metric or curves.attrs.get("metric")
    if metric not in METRICS:
        raise AttributionError("curve_summary needs the curves' metric: pass metric= "
                               f"(one of {', '.join(METRICS)}).")
    damage_sign = 1.0 if metric in HIGHER_IS_WORSE else -1.0
    random_curves = curves.attrs.get("random_curves")
    if "subset" in curves.columns:
        parts = {name: part for name, part in curves.groupby("subset", sort=False)}
        random_by_subset = random_curves if isinstance(random_curves, dict) else {}
    else:
        parts = {"all": curves}
        random_by_subset = {"all": random_curves} if random_curves is not None else {}
    rows = []
    for name, part in parts.items():
        part = part.sort_values("k")
        k = part["k"].to_numpy(dtype=np.float64)
        ranked = _mean_over_k(part["ranked"].to_numpy(), k)
        random_mean = _mean_over_k(part["random_mean"].to_numpy(), k)
        draws = random_by_subset.get(name)
        if draws is None or any(len(draw) != len(k) for draw in draws):  # e.g. rows sliced
            beaten = p_value = np.nan
        else:
            areas = np.array([_mean_over_k(np.asarray(draw), k) for draw in draws])
            margin = damage_sign * (ranked - areas)
            wins = (margin > 0) + 0.5 * (margin == 0)
            beaten = float(np.mean(wins))
            p_value = float((1 + np.sum(1 - wins)) / (len(wins) + 1))
        interior = part[(part["k"] > 0)
                        & (part["k"] < curves.attrs.get("n_neurons", part["k"].max()))]
        beyond = (interior["ranked"] > interior["random_hi"] if damage_sign > 0
                  else interior["ranked"] < interior["random_lo"])
        rows.append({"subset": name, "area_ranked": ranked,
                     "area_bottom": _mean_over_k(part["bottom"].to_numpy(), k),
                     "area_random": random_mean,
                     "gap_vs_random": damage_sign * (ranked - random_mean),
                     "fraction_random_beaten": beaten, "p_value": p_value,
                     "outside_band": float(beyond.mean()) if len(interior) else np.nan})
    return pd.DataFrame(rows).set_index("subset")


def _mean_over_k(values: np.ndarray, k: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    if len(k) == 1:
        return float(values[0])
    return float(np.trapezoid(values, k) / (k[-1] - k[0]))


def neuron_vector(scores, n_neurons: Optional[int]) -> np.ndarray:
    """One float per neuron [n_neurons] from an array, tensor or a `cluster_scores` row
    (n_neurons None: as many as it holds; the layer then checks the count)."""
    if isinstance(scores, pd.DataFrame):
        if len(scores) != 1:
            raise AttributionError("Pass one row of cluster_scores (e.g. df.loc[cluster]), not "
                                   f"a table of {len(scores)} rows.")
        scores = scores.iloc[0]
    if isinstance(scores, pd.Series):
        scores = scores.drop("n", errors="ignore").to_numpy()  # a cluster_scores row's size
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().cpu().numpy()
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    if n_neurons is not None and values.shape[0] != n_neurons:
        raise AttributionError(f"scores has {values.shape[0]} values but the layer has "
                               f"{n_neurons} neurons; pass one score per neuron.")
    if not np.isfinite(values).all():
        raise AttributionError("scores contain NaN or inf; a ranking needs finite scores "
                               "(run at.diagnose to see why they are not).")
    return values


def refinement_rounds(count: int) -> list[list[int]]:
    """Positions 0..count-1 grouped coarse to fine: both ends, the middle, then bisection.

    Each round's union with the earlier ones covers the range about evenly; round sizes
    are 5, 4, 8, 16, ... so the first progress update comes after very little work.
    """
    order = [0, count - 1] if count > 1 else list(range(count))
    intervals = deque([(0, count - 1)] if count > 2 else [])
    while intervals:
        low, high = intervals.popleft()
        if high - low < 2:
            continue
        middle = (low + high) // 2
        order.append(middle)
        intervals.extend([(low, middle), (middle, high)])
    rounds, end = [], _FIRST_ROUND
    begin = 0
    while begin < len(order):
        rounds.append(order[begin:end])
        begin, end = end, 2 * end - 1
    return rounds


def random_orders(n_neurons: int, n_random: int, seed: int) -> torch.Tensor:
    """Seeded random removal orders [n_random, n_neurons] (LongTensor)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n_neurons, generator=generator)
                        for _ in range(n_random)]).reshape(n_random, n_neurons)


# ---------------------------------------------------------------------------- the engine

@dataclass
class _Captured:
    """One batch at the layer: z [B, n, ...], runner state, targets [B], subset codes [B],
    and for a sequence layer under an attention mask the real tokens [B, 1, T] (else None)."""

    z: torch.Tensor
    state: Any
    targets: torch.Tensor
    groups: torch.Tensor
    real: Optional[torch.Tensor] = None


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(item) for item in value)
    if isinstance(value, NamedInputs):
        return sum(_nbytes(item) for item in value.values())
    return 0


class _LayerPasses:
    """Passes over the inputs at the layer; the first pass keeps what fits in memory."""

    def __init__(self, layer_pass: LayerPass, groups, n_groups):
        self.layer_pass, self.groups, self.n_groups = layer_pass, groups, n_groups
        self.inputs, self.device = layer_pass.inputs, layer_pass.device
        self.kept: Optional[list[_Captured]] = []
        self.counts = np.zeros(n_groups, dtype=np.int64)
        self.n_neurons = 0
        self.z_sum: Optional[torch.Tensor] = None  # [n, ...] float64, sum over samples
        self.z_count: Optional[torch.Tensor] = None  # [n, ...] float64, samples summed there
        self.z_dtype = torch.float32

    @property
    def runner(self):
        return self.layer_pass.runner

    def first_pass(self, mean: bool) -> None:
        """Capture every batch once: sample counts, the number of neurons, the cache, and
        with `mean` the sums for the mean of z (a float64 copy of each batch's z: only
        "mean" ablation reads it)."""
        kept_bytes = 0
        for captured in self._read():
            self.counts += np.bincount(captured.groups.cpu().numpy(), minlength=self.n_groups)
            self.n_neurons, self.z_dtype = captured.z.shape[1], captured.z.dtype
            if mean:
                real = (captured.real if captured.real is not None
                        else torch.ones((), dtype=captured.z.dtype, device=captured.z.device))
                batch_sum = (captured.z * real).double().sum(0)  # padding counts for no mean
                batch_count = real.double().expand_as(captured.z).sum(0)
                self.z_sum = batch_sum if self.z_sum is None else self.z_sum + batch_sum
                self.z_count = (batch_count if self.z_count is None
                                else self.z_count + batch_count)
            if self.kept is not None:
                kept_bytes += _nbytes(captured.z) + _nbytes(captured.state)
                if kept_bytes <= _CACHE_BYTES:
                    self.kept.append(captured)
                elif iter(self.inputs) is self.inputs:
                    raise AttributionError(
                        "The inputs are a one-shot iterator and their layer outputs do not "
                        "fit in memory; pass a DataLoader or an array (read more than once).")
                else:
                    self.kept = None

    @property
    def cached(self) -> bool:
        return self.kept is not None

    def __iter__(self):
        return iter(self.kept) if self.kept is not None else self._read()

    def _read(self):
        for _, captured in self.layer_pass.run(self._captured):
            yield captured

    def _captured(self, batch: LayerBatch) -> _Captured:
        """Capture one batch of the pass (on a CPU a row chunk: `_CPU_ELEMENTS_PER_CAPTURE`)."""
        z, state, logits = batch.runner.capture(batch.x)
        broken = torch.nonzero(~torch.isfinite(logits).all(1))[:, 0].cpu() + batch.start
        if len(broken):
            shown = ", ".join(map(str, broken[:8].tolist())) + (", ..." if len(broken) > 8
                                                               else "")
            raise AttributionError(
                f"The model's logits are NaN or inf on sample(s) {shown} before any neuron "
                "is removed, so no metric of a pruned model can be measured on them. "
                "Leave them out, or fix the model or inputs (at.diagnose lists them all).")
        targets = logits.argmax(1) if batch.targets is None else batch.targets
        stop = batch.start + batch.rows
        if self.groups is None:
            groups = torch.zeros(batch.rows, dtype=torch.long, device=self.device)
        else:
            if stop > len(self.groups):
                raise AttributionError("There are more samples than cluster ids.")
            groups = torch.as_tensor(self.groups[batch.start:stop], device=self.device)
        mask = attention_mask(batch.x)
        real = (mask[:, None, :].to(z.dtype) if mask is not None and z.dim() == 3
                and z.shape[-1] == mask.shape[1] else None)
        return _Captured(z, state, targets, groups, real)


def metric_values(logits: torch.Tensor, targets: torch.Tensor, metric: str) -> torch.Tensor:
    """The metric of each row [R] for logits [R, C] and targets [R], in the logits' dtype:
    1 where the top logit is the target's, else 0 ("accuracy"), the target's logit
    ("target_logit"), the cross-entropy ("loss"), or, for a regression head (C = 1) and
    targets that are true values, (output - value)^2 ("squared_error"). Every measure of a
    pruned model (the curves, the neuron view's removal) is a mean of these."""
    regression = logits.shape[1] == 1
    if (regression and metric in CLASSIFIER_METRICS) or (
            not regression and metric == "squared_error"):
        raise AttributionError(
            f"{metric} measures a classifier, and this model has one output (a regression "
            "head): measure 'squared_error' against the true values, or 'target_logit' (the "
            "output itself)." if regression else
            f"squared_error measures a regression head (one output) against true values; "
            f"this model has {logits.shape[1]} outputs: use accuracy, target_logit or loss.")
    if metric == "squared_error":
        if not targets.is_floating_point():
            raise AttributionError("squared_error measures each output against its true "
                                   "value: pass the true values [N] as the targets (data "
                                   "without them: measure 'target_logit', the output).")
        return (logits[:, 0] - targets.to(logits.dtype)).square()
    if regression:  # target_logit: the one output, whatever true values came with it
        return logits[:, 0]
    if targets.is_floating_point():
        raise AttributionError(f"{metric} needs class ids as targets; got real values, which "
                               "only a regression head (one output) takes.")
    if metric == "accuracy":
        return (logits.max(1).indices == targets).to(logits.dtype)  # faster than argmax
    if metric == "target_logit":
        return logits.gather(1, targets[:, None])[:, 0]
    return functional.cross_entropy(logits, targets, reduction="none")


def model_metric(model: nn.Module, inputs: Inputs, targets, metric: Optional[str] = None, *,
                 batch_size: int = DEFAULT_BATCH_SIZE, device=None) -> float:
    """The model's metric over the inputs (the mean of `metric_values`), e.g. the accuracy
    of a pruned copy. targets: LongTensor [N], "labels" (the y of each (x, y) batch), or None
    (this model's own predicted class: to compare a pruned copy with the curve's None, pass
    the unpruned model's `predict_classes`)."""
    _check_options(DEFAULT_ABLATION, metric, 1, batch_size)
    layer_pass = LayerPass(model, None, inputs, targets, batch_size=batch_size, device=device,
                           grad=False, accepts=("labels",), what="evaluate",
                           need="A metric needs one target per sample",
                           values=_values(metric))
    total, count = 0.0, 0
    for batch, logits in layer_pass.run(lambda batch: run_logits(layer_pass.model, batch.x)):
        metric = chosen_metric(metric, logits.shape[1], batch.targets)
        batch_targets = logits.argmax(1) if batch.targets is None else batch.targets
        total += float(metric_values(logits.float(), batch_targets, metric).double().sum())
        count += batch.rows
    return total / count


def chosen_metric(metric: Optional[str], n_outputs: int, targets) -> str:
    """`metric`, or where it is None the default for this head (`settings.default_metric`):
    accuracy for a classifier; for a regression head (one output) the squared error against
    its true values when the targets are real values, else its output ("target_logit")."""
    if metric is not None:
        return metric
    if n_outputs != 1:
        return DEFAULT_METRIC
    real = isinstance(targets, torch.Tensor) and targets.is_floating_point()
    return "squared_error" if real else "target_logit"


def model_default_metric(model: nn.Module, inputs, targets, metric: Optional[str] = None
                         ) -> str:
    """`chosen_metric` for `model` on in-memory `inputs` (one row is run to count the
    outputs where `metric` is None)."""
    if metric is not None:
        return metric
    with eval_mode(model), torch.no_grad():
        row = to_model(take(named(inputs), slice(0, 1)), model, model_device(model))
        logits = run_logits(model, row)
    return chosen_metric(None, logits.shape[1], targets)


def _values(metric: Optional[str]) -> Optional[bool]:
    """`LayerPass`'s values for a metric: real values needed (squared error), class ids
    needed, or either (None: the metric follows the head and the targets)."""
    return None if metric is None else metric == "squared_error"


def _masked_sums(runner, captured: _Captured, removed: torch.Tensor, fill: Optional[torch.Tensor],
                 metric: str, n_groups: int) -> torch.Tensor:
    """Metric sums per mask and subset [M, G] for masks `removed` [M, n] (True = removed)."""
    z = captured.z
    rows = z.shape[0]
    budget = _ELEMENTS_PER_PASS["cpu" if z.device.type == "cpu" else "other"]
    per_pass = max(1, budget // max(1, z[0].numel()) // rows)
    subset_matrix = functional.one_hot(captured.groups, n_groups).double()  # [B, G]
    multiply = fill is None and bool(torch.isfinite(z).all())  # 0 * inf would be NaN
    if fill is None:
        fill = torch.zeros((), dtype=z.dtype, device=z.device)
    sums = []
    with pass_modes(grad=False):  # as the capture: not the caller's autocast
        for begin in range(0, removed.shape[0], per_pass):
            chunk = removed[begin:begin + per_pass]
            count = chunk.shape[0]
            mask = chunk.view((count, 1, chunk.shape[1]) + (1,) * (z.dim() - 2))
            if multiply:  # faster than masked_fill / where on a CPU
                variants = z.unsqueeze(0) * (~mask).to(z.dtype)
            else:
                variants = torch.where(mask, fill, z.unsqueeze(0))
            logits = runner.tail(variants.flatten(0, 1), captured.state, count)
            values = metric_values(logits, captured.targets.repeat(count), metric)
            sums.append(values.view(count, rows).double() @ subset_matrix)
    return torch.cat(sums)


def _order_sums(passes: "_LayerPasses", orders: torch.Tensor, ks: Sequence[int],
                fill: Optional[torch.Tensor], metric: str) -> torch.Tensor:
    """Metric sums [O, K, G] after removing the first ks[k] neurons of each order [O, n],
    per subset; a mask shared by several (order, k) pairs is evaluated once."""
    masks = _removal_masks(orders, ks)  # [O, K, n]
    unique, inverse = torch.unique(masks.reshape(-1, orders.shape[1]).to(passes.device),
                                   dim=0, return_inverse=True)
    sums = torch.zeros(unique.shape[0], passes.n_groups, dtype=torch.float64)
    for captured in passes:
        sums += _masked_sums(passes.runner, captured, unique, fill, metric,
                             passes.n_groups).cpu()
    return sums[inverse.cpu()].view(orders.shape[0], len(ks), passes.n_groups)


def order_curves(model: nn.Module, layer, inputs: Inputs, targets, orders: torch.Tensor,
                 ks: Sequence[int], *, ablation: str = DEFAULT_ABLATION,
                 metric: Optional[str] = None, batch_size: int = DEFAULT_BATCH_SIZE,
                 device=None) -> np.ndarray:
    """The metric after removing the first k neurons of each removal order, in one pass.

    Args:
        orders: removal orders [O, n_neurons] (LongTensor, each a permutation of the
            neurons; e.g. several methods' rankings and `random_orders`).
        ks: the k values (0..n_neurons).
        Other arguments as in `pruning_curve`.
    Returns:
        float64 [O, len(ks)]: the metric's mean over the samples, per order and k.
    """
    _check_options(ablation, metric, 1, batch_size)
    layer_pass = LayerPass(model, layer, inputs, targets, batch_size=batch_size, device=device,
                           grad=False, accepts=("labels",), what="evaluate",
                           need="Pruning curves need one target per sample",
                           cpu_layer_elements=_CPU_ELEMENTS_PER_CAPTURE,
                           values=_values(metric))
    with eval_mode(layer_pass.model):
        passes = _LayerPasses(layer_pass, None, 1)
        passes.first_pass(mean=ablation == "mean")
        if orders.dim() != 2 or orders.shape[1] != passes.n_neurons:
            raise AttributionError(f"orders must be [O, {passes.n_neurons}] (the layer's "
                                   f"neurons); got {list(orders.shape)}.")
        fill = None
        if ablation == "mean":
            fill = (passes.z_sum / passes.z_count.clamp_min(1)).to(passes.z_dtype)
        metric = chosen_metric(metric, passes.runner.n_classes, layer_pass.targets)
        sums = _order_sums(passes, orders, check_ks(ks, passes.n_neurons), fill, metric)
    return (sums[:, :, 0] / max(1, int(passes.counts[0]))).numpy()


def _removal_masks(orders: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """[O, K, n] bool: mask (o, k) removes the first ks[k] neurons of order o."""
    n_orders, n_neurons = orders.shape
    rank = torch.empty_like(orders)
    rank.scatter_(1, orders, torch.arange(n_neurons).expand(n_orders, -1))  # position of neuron
    limits = torch.as_tensor(list(ks), dtype=torch.long)
    return rank[:, None, :] < limits[None, :, None]


def _check_options(ablation: str, metric: str, n_random: int, batch_size: int) -> None:
    if ablation not in ABLATIONS:
        raise AttributionError(f"Unknown ablation {ablation!r}; use one of {', '.join(ABLATIONS)}.")
    if metric is not None and metric not in METRICS:
        raise AttributionError(f"Unknown metric {metric!r}; use one of {', '.join(METRICS)}.")
    if not isinstance(n_random, (int, np.integer)) or n_random < 1:
        raise AttributionError("n_random must be a positive integer (20 gives a usable band).")
    if batch_size < 1:
        raise AttributionError("batch_size must be a positive integer.")


def spaced_ks(n_neurons: int, most: int) -> list[int]:
    """Every k from 0 to `n_neurons` when that is at most `most` + 1 values, else `most` + 1
    evenly spaced ones (0 and n_neurons included): a curve's shape at a bounded cost."""
    return sorted(set(np.linspace(0, n_neurons, min(n_neurons, most) + 1).round()
                      .astype(int).tolist()))


def check_ks(ks: Optional[Sequence[int]], n_neurons: int) -> list[int]:
    if ks is None:
        return list(range(n_neurons + 1))
    values = np.asarray(list(ks))
    if (values.ndim == 1 and np.issubdtype(values.dtype, np.floating)
            and np.isfinite(values).all() and (values == np.round(values)).all()):
        values = values.astype(np.int64)  # e.g. np.linspace(0, n, 33).round()
    if values.size == 0 or values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise AttributionError("ks must be a non-empty list of integers (numbers of neurons "
                               "removed).")
    if values.min() < 0 or values.max() > n_neurons:
        raise AttributionError(f"ks must lie in 0..{n_neurons} (the layer has {n_neurons} "
                               f"neurons); got {int(values.min())}..{int(values.max())}.")
    return sorted(set(int(k) for k in values))


def _curves(model, layer, inputs, targets, scores, groups, subset_names, *, ks, n_random, seed,
            ablation, metric, batch_size, progress, resume, device) -> pd.DataFrame:
    """Shared body of `pruning_curve` (one subset) and `cluster_pruning_curves` (two)."""
    _check_options(ablation, metric, n_random, batch_size)
    layer_pass = LayerPass(model, layer, inputs, targets, batch_size=batch_size, device=device,
                           grad=False, accepts=("labels",), what="evaluate",
                           need="Pruning curves need one target per sample",
                           cpu_layer_elements=_CPU_ELEMENTS_PER_CAPTURE,
                           values=_values(metric))
    n_groups = 1 if groups is None else len(subset_names)
    with eval_mode(layer_pass.model):  # the cached captures' masked passes too
        passes = _LayerPasses(layer_pass, groups, n_groups)
        passes.first_pass(mean=ablation == "mean")
        metric = chosen_metric(metric, passes.runner.n_classes, layer_pass.targets)
        n_neurons = passes.n_neurons
        values = neuron_vector(scores, n_neurons)
        ks = check_ks(ks, n_neurons)
        orders = torch.cat([
            torch.as_tensor(np.argsort(-values, kind="stable"))[None],
            torch.as_tensor(np.argsort(values, kind="stable"))[None],
            random_orders(n_neurons, n_random, seed),
        ])
        fill = None
        if ablation == "mean":
            fill = (passes.z_sum / passes.z_count.clamp_min(1)).to(passes.z_dtype)
        rounds = refinement_rounds(len(ks))
        if progress is None:  # nobody watches: one round, fewest passes
            rounds = [sum(rounds, [])]
        elif not passes.cached:  # every round re-reads the inputs: a coarse round, the rest
            rounds = rounds[:1] + ([sum(rounds[1:], [])] if len(rounds) > 1 else [])
        sums = torch.zeros(orders.shape[0], len(ks), n_groups, dtype=torch.float64)
        done: list[int] = []
        if resume is not None:
            done = _resumed(resume, sums, passes.counts, ks, subset_names, orders, metric,
                            ablation)
            rounds = [kept for kept in ([p for p in positions if p not in done]
                                        for positions in rounds) if kept]
        for positions in rounds:
            sums[:, positions] = _order_sums(passes, orders, [ks[p] for p in positions], fill,
                                             metric)
            done.extend(positions)
            if progress is not None:
                progress(len(done) / len(ks), curve_frame(
                    sums, passes.counts, ks, sorted(done), subset_names, orders, metric,
                    ablation, n_random, seed, layer_attrs(passes.runner)))
    return curve_frame(sums, passes.counts, ks, list(range(len(ks))), subset_names, orders,
                       metric, ablation, n_random, seed, layer_attrs(passes.runner))


def _resumed(partial: pd.DataFrame, sums: torch.Tensor, counts: np.ndarray, ks: list[int],
             subset_names, orders: torch.Tensor, metric: str, ablation: str) -> list[int]:
    """Fill `sums` [O, K, G] at the k positions of `partial` (a progress frame of the same
    curve); returns those positions."""
    attrs = partial.attrs
    names = subset_names or (None,)
    sizes = attrs.get("n_samples") if subset_names else {None: attrs.get("n_samples")}
    draws = attrs.get("random_curves") if subset_names else {None: attrs.get("random_curves")}
    same = (attrs.get("metric") == metric and attrs.get("ablation") == ablation
            and attrs.get("orders") == orders.tolist() and isinstance(sizes, dict)
            and all(sizes.get(name, 0) == int(counts[group]) for group, name in enumerate(names))
            and set(partial["k"]) <= set(ks))
    if not same:
        raise AttributionError("resume= holds a partial curve of other scores, random orders, "
                               "metric, ablation or samples; compute this curve from the "
                               "start (resume=None).")
    positions = sorted(ks.index(int(k)) for k in pd.unique(partial["k"]))
    for group, name in enumerate(names):
        if counts[group] == 0:
            continue
        part = partial if name is None else partial[partial["subset"] == name]
        part = part.sort_values("k")
        if [ks.index(int(k)) for k in part["k"]] != positions:
            raise AttributionError("resume= has different k values per subset; compute this "
                                   "curve from the start (resume=None).")
        random_means = np.asarray(draws[name], dtype=np.float64)
        if random_means.shape != (orders.shape[0] - 2, len(part)):
            raise AttributionError("resume= lacks the random curves of its points; compute "
                                   "this curve from the start (resume=None).")
        means = np.vstack([part["ranked"], part["bottom"], random_means])  # [O, K]
        sums[:, positions, group] = torch.from_numpy(means * float(counts[group]))
    return positions


def curve_frame(sums: torch.Tensor, counts: np.ndarray, ks: list[int], positions: list[int],
                subset_names, orders: torch.Tensor, metric: str, ablation: str, n_random: int,
                seed: int, layer: dict) -> pd.DataFrame:
    """The curve table for the k positions done so far (ascending k); `layer`: the
    `runners.layer_attrs` of the layer, added to the attrs."""
    names = subset_names or (None,)
    k_values = np.asarray(ks)[positions]
    parts, random_curves, sizes = [], {}, {}
    for group, subset in enumerate(names):
        if counts[group] == 0:
            continue
        means = (sums[:, positions, group] / counts[group]).numpy()  # [O, K]
        draws = means[2:]
        low, high = np.percentile(draws, BAND_PERCENTILES, axis=0)
        part = pd.DataFrame({"k": k_values, "ranked": means[0], "bottom": means[1],
                             "random_mean": draws.mean(0), "random_lo": low,
                             "random_hi": high})
        if subset is not None:
            part.insert(0, "subset", subset)
        parts.append(part)
        random_curves[subset], sizes[subset] = draws.tolist(), int(counts[group])
    frame = pd.concat(parts, ignore_index=True)
    single = subset_names is None
    frame.attrs = {
        "metric": metric, "ablation": ablation, "n_neurons": int(orders.shape[1]),
        "n_random": n_random, "seed": seed, "random_orders": orders[2:].tolist(),
        "orders": orders.tolist(),  # ranked, bottom, then the random ones: for resume=
        "n_samples": sizes[None] if single else sizes,
        "random_curves": random_curves[None] if single else random_curves,
        **layer,
    }
    return frame

"""Path methods: `integrated_gradients` and `conductance`, their quadrature
(Gauss-Legendre), the check that a sample's scores sum to the difference they integrate
(`PathSums`, `sum_check`), and the refinement of a sample that misses it (twice the steps
for integrated gradients, bisection of the path for conductance)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..engine import model_io
from .registry import REGISTRY, Batch, Targets, register
from .shared import (batch_mask, classes_first, nan_where_not_finite, neuron_dim,
                     reduce_spatial, repeated_targets, resolve_targets, selected_logits,
                     step_chunks, target_gradients, with_class_axis)


def gauss_legendre(n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [n], alphas [n]) of Gauss-Legendre quadrature on [0, 1], alphas ascending."""
    weights, alphas = _gauss_legendre_on_cpu(n)
    return weights.to(device), alphas.to(device)


@functools.lru_cache(maxsize=64)
def _gauss_legendre_on_cpu(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Golub-Welsch in torch, float64, once per n. Not NumPy's `leggauss`: its LAPACK call
    wakes NumPy's own OpenBLAS threads, which then spin beside torch's on the same cores and
    slow every batch after it."""
    k = torch.arange(1, n, dtype=torch.float64)
    off_diagonal = k / torch.sqrt(4 * k * k - 1)
    jacobi = torch.diag(off_diagonal, 1) + torch.diag(off_diagonal, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    weights = 2 * vectors[0] ** 2
    nodes, weights = (nodes - nodes.flip(0)) / 2, (weights + weights.flip(0)) / 2  # symmetric
    return (0.5 * weights).float(), (0.5 * (nodes + 1)).float()


SUM_TOLERANCE = 0.01
"""How far a path method's scores of a sample may miss, summed over the layer, the difference
they integrate (`Method.sums_to`), as a share of that difference; a sample that misses it
is integrated again where the method refines (`Method.refine_factor`: integrated gradients
with twice the steps, conductance by bisection), and counted where it still misses."""
SUM_FLOOR = 1e-3
"""Logits: a difference smaller than this is held to SUM_TOLERANCE of it (float rounding)."""
MAX_STEPS_FACTOR = 16
"""A sample integrated again may take up to this many times `n_steps` steps."""


def sum_misses(gap: torch.Tensor, difference: torch.Tensor) -> torch.Tensor:
    """Which samples' scores miss their sum: |gap| > SUM_TOLERANCE x max(|difference|,
    SUM_FLOOR); [B] from [B] or [B, C] (any class), False where the logit is not finite."""
    misses = gap.abs() > SUM_TOLERANCE * difference.abs().clamp_min(SUM_FLOOR)
    return misses if misses.dim() == 1 else misses.any(1)


@dataclass(frozen=True)
class PathSums:
    """What a path method reports per sample beside its scores: `gap`, the difference minus
    the scores' sum over the layer (NaN where the sum does not apply); `difference`, what
    they integrate (logits), each [N] or [N, C] for every class; `steps`, the steps each
    sample took [N]. Tensors of one batch (`Batch.report_sums`), NumPy arrays over a
    computation (`scores.ScoreFacts.sums`)."""

    gap: Any
    difference: Any
    steps: Any

    def shares(self) -> np.ndarray:
        """float64 [N]: by how much each sample's scores miss their sum, as a share of the
        difference on `sum_misses`' scale (every class: the largest); NaN where the sum
        does not apply."""
        gap, difference = (np.asarray(value, dtype=np.float64)
                           for value in (self.gap, self.difference))
        share = np.abs(gap) / np.maximum(np.abs(difference), SUM_FLOOR)
        return np.max(share, axis=1) if share.ndim > 1 else share


@dataclass(frozen=True)
class SumCheck:
    """A path method's sum check over the samples of one computation (`sum_check`).

    Attributes:
        n_samples: samples checked (those whose sum applies: conductance's does not where a
            path bypasses the layer).
        n_bypassed: samples whose sum does not apply.
        n_refined: samples that took more than the `n_steps` asked for.
        most_steps: the most steps a sample took.
        n_missing: samples whose scores still miss their sum by more than SUM_TOLERANCE.
        worst: the largest miss, as a share of the difference (`sum_misses`' scale).
    """

    n_samples: int
    n_bypassed: int
    n_refined: int
    most_steps: int
    n_missing: int
    worst: float


def sum_check(sums: Optional[PathSums], n_steps: int) -> Optional[SumCheck]:
    """The sum check of a computation at `n_steps` from its `sums` (`ScoreFacts.sums`); None
    without them (a method without a sum)."""
    if sums is None:
        return None
    share = sums.shares()
    bypassed = np.isnan(share)
    steps = np.asarray(sums.steps)
    checked = share[~bypassed]
    return SumCheck(int(checked.size), int(bypassed.sum()), int((steps > n_steps).sum()),
                    int(steps.max()) if steps.size else n_steps,
                    int((checked > SUM_TOLERANCE).sum()),
                    float(checked.max()) if checked.size else 0.0)


def _checked_sum(batch: Batch, attribution: torch.Tensor, difference: torch.Tensor,
                 targets: Targets, steps: torch.Tensor, applies: torch.Tensor) -> torch.Tensor:
    """Scores [B, (C,) n] of a path method whose scores sum over the layer to a difference
    of the target logit, from its scores at every position [B, (C,) n, ...], that
    difference [B] or [B, C], the resolved targets, the steps each sample took [B] and where
    the sum applies [B] (bool, False for a sample with a path around the layer). What the
    scores miss of it goes to `batch.report_sums` (its gap NaN where the sum does not
    apply)."""
    if batch.report_sums is not None:
        gap = difference - _layer_sum(attribution, targets)
        where = applies if gap.dim() == 1 else applies.unsqueeze(1)
        batch.report_sums(PathSums(gap.where(where, gap.new_tensor(float("nan"))),
                                   difference, steps))
    return reduce_spatial(attribution, neuron_dim(targets), "sum", batch_mask(batch))


def _refined(batch: Batch, positions: Callable[[Batch], tuple], max_steps: int,
             previous_gap: Optional[torch.Tensor] = None) -> tuple:
    """(scores at every position [B, (C,) n, ...], difference, targets, steps [B], where the
    sum applies) of a path method whose `positions(batch)` gives the first four but steps:
    the samples that miss their sum (`sum_misses`) are integrated again with twice the
    steps, recursively on a batch of those samples alone, up to `max_steps`, while more
    steps still change their gap (a gap they no longer change is not the quadrature's)."""
    attribution, difference, targets, applies = positions(batch)
    gap = difference - _layer_sum(attribution, targets)
    steps = torch.full((gap.shape[0],), batch.n_steps, dtype=torch.int32, device=gap.device)
    again = sum_misses(gap, difference) & applies
    if previous_gap is not None:  # a gap more steps no longer change is not the quadrature's
        again &= _row_size(gap - previous_gap) > SUM_TOLERANCE * _row_size(previous_gap)
    # the one value a path method reads per batch, also where reads stall the device: a
    # batch of n_steps passes pays for it once
    if batch.n_steps * 2 > max_steps or not bool(again.any()):
        return attribution, difference, targets, steps, applies
    rows = again.nonzero()[:, 0]
    fewer = replace(batch, x=model_io.take(batch.x, rows), n_steps=batch.n_steps * 2,
                    targets=targets if isinstance(targets, str) else targets[rows],
                    codes=None, report_sums=None)
    better, _, _, more_steps, _ = _refined(fewer, positions, max_steps, gap[rows])
    attribution[rows] = better
    steps[rows] = more_steps
    return attribution, difference, targets, steps, applies


def _layer_sum(attribution: torch.Tensor, targets: Targets) -> torch.Tensor:
    """Scores at every position [B, (C,) n, ...] summed over the layer: [B] or [B, C]."""
    return attribution.flatten(neuron_dim(targets)).sum(-1)


def _row_size(gap: torch.Tensor) -> torch.Tensor:
    """|gap| per sample [B] (the largest over classes)."""
    return gap.abs() if gap.dim() == 1 else gap.abs().amax(1)


@register("integrated_gradients",
          "z * integral of dF/dz along 0 -> z (zero baseline at the layer); checks that the "
          "scores sum to F(z) - F(0), with more steps where they do not",
          label="integrated gradients", units="logits", colour="#88CCEE",
          uses_gradients=True, logit_effect="score", sums_to="F(z) - F(0) at the layer",
          refine_factor=MAX_STEPS_FACTOR)  # Gauss-Legendre converges fast: a miss is a sharp
# feature (a LayerNorm after the layer) that a few doublings resolve
def integrated_gradients(batch: Batch) -> torch.Tensor:
    max_steps = batch.n_steps * REGISTRY["integrated_gradients"].refine_factor
    return _checked_sum(batch, *_refined(batch, _integrated_positions, max_steps))


def _integrated_positions(batch: Batch) -> tuple:
    """Integrated gradients at every position [B, (C,) n, ...], F(z) - F(0) at the layer,
    targets."""
    runner = batch.runner
    z, state, logits = runner.capture(batch.x)  # the front runs once per batch
    targets = resolve_targets(batch.targets, logits)
    weights, alphas = gauss_legendre(batch.n_steps, z.device)
    n_rows = z.shape[0]
    total = None
    for steps in step_chunks(batch.n_steps, n_rows, batch.max_rows):
        shape = (-1,) + (1,) * z.dim()
        scaled = (alphas[steps].view(shape) * z.unsqueeze(0)).flatten(0, 1)
        scaled = scaled.to(z.dtype).requires_grad_(True)  # a half-precision model stays half
        repeats = alphas[steps].numel()
        step_logits = runner.tail(scaled, state, repeats)  # score_batches turned autograd on
        grad = target_gradients(batch, step_logits, scaled, targets, repeats)
        grad = grad.unflatten(-z.dim(), (repeats, n_rows))  # [(C,) S, B, n, ...]
        moved = grad.movedim(-z.dim() - 1, 0)  # [S, (C,) B, n, ...]
        weighted = (weights[steps].view((-1,) + (1,) * (moved.dim() - 1)) * moved).sum(0)
        total = weighted if total is None else total + weighted
    total = nan_where_not_finite(total, selected_logits(logits, targets), targets)  # alpha = 1 too
    with torch.no_grad():
        at_zero = selected_logits(runner.tail(torch.zeros_like(z), state, 1), targets)
    return (with_class_axis(z, targets) * classes_first(total, targets),
            selected_logits(logits, targets) - at_zero, targets,
            torch.ones(n_rows, dtype=torch.bool, device=z.device))  # a path integral: always


@register("conductance",
          "Layer conductance with a zero input baseline (Dhamdhere et al.; as Captum); checks "
          "that the scores sum to F(x) - F(0), bisecting the path where they do not",
          units="logits", colour="#999933", needs_float_inputs=True, uses_gradients=True,
          logit_effect="score", sums_to="F(x) - F(0) at the inputs",
          refine_factor=MAX_STEPS_FACTOR)
def conductance(batch: Batch) -> torch.Tensor:
    max_steps = batch.n_steps * REGISTRY["conductance"].refine_factor
    return _checked_sum(batch, *_conductance_refined(batch, max_steps))


def _conductance_refined(batch: Batch, max_steps: int) -> tuple:
    """(conductance at every position [B, (C,) n, ...], F(x) - F(0) at the inputs [B] or
    [B, C], targets, steps [B], where the sum applies [B]).

    First Captum's sum: sum_k (z(a_k+1) - z(a_k)) dF/dz(a_k) over `n_steps` + 1
    Gauss-Legendre nodes a_k of the path a x. It converges only as 1/steps: each ReLU that
    switches along the path adds an error of its jump times a step. The samples that miss
    their sum are integrated again (`_bisected`), each on its own path."""
    runner, x = batch.runner, batch.x
    real_z, _, real_logits = runner.capture(x)  # the quadrature's steps never reach alpha = 1
    targets = resolve_targets(batch.targets, real_logits)
    n, n_nodes = model_io.n_rows(x), batch.n_steps + 1
    _, alphas = gauss_legendre(n_nodes, model_io.device_of(x))
    z_path, grad_path = _path_points(batch, model_io.interpolate(x, alphas),
                                     repeated_targets(targets, n_nodes))
    z_steps = z_path.unflatten(0, (n_nodes, n))  # [S+1, B, n, ...]
    grad_steps = grad_path.unflatten(-z_path.dim(), (n_nodes, n))  # [(C,) S+1, B, n, ...]
    rise = z_steps[1:] - z_steps[:-1]  # [S, B, n, ...]
    if isinstance(targets, str):
        attribution = (rise.unsqueeze(0) * grad_steps[:, :-1]).sum(1)  # [C, B, n, ...]
    else:
        attribution = (rise * grad_steps[:-1]).sum(0)
    attribution = classes_first(
        nan_where_not_finite(attribution, selected_logits(real_logits, targets), targets), targets)
    with torch.no_grad():
        real = selected_logits(real_logits, targets)
        _, state_at_zero, at_zero = runner.capture(model_io.interpolate(x, alphas.new_zeros(1)))
        start_with_real_layer = selected_logits(runner.tail(real_z, state_at_zero, 1), targets)
    difference = real - selected_logits(at_zero, targets)
    # the sum holds where the layer carries every path: with the layer's output of x, the
    # rest of the model run from the zero input gives F(x)
    applies = ~sum_misses(real - start_with_real_layer, difference)
    steps = torch.full((n,), batch.n_steps, dtype=torch.int32, device=difference.device)
    gap = difference - _layer_sum(attribution, targets)
    again = sum_misses(gap, difference) & applies
    # the one value a path method reads per batch (see _refined)
    if max_steps <= n_nodes or not bool(again.any()):
        return attribution, difference, targets, steps, applies
    rows = again.nonzero()[:, 0]
    point_dim = neuron_dim(targets) - 1  # of grad_steps' S+1 and B dims, the first
    better, better_steps = _bisected(
        batch, model_io.take(x, rows), targets if isinstance(targets, str) else targets[rows],
        alphas, z_steps[:, rows], grad_steps.index_select(point_dim + 1, rows),
        difference[rows], max_steps, _interval_budget(grad_steps, n_nodes * n))
    improves = _row_size((difference[rows] - _layer_sum(better, targets))
                         / difference[rows].abs().clamp_min(SUM_FLOOR)) < _row_size(
        gap[rows] / difference[rows].abs().clamp_min(SUM_FLOOR))
    attribution[rows] = torch.where(_broadcast_rows(improves, better), better,
                                    attribution[rows])
    steps[rows] = torch.where(improves, better_steps, steps[rows])
    return attribution, difference, targets, steps, applies


MAX_BISECTIONS = 24
"""Rounds of bisection `_bisected` runs at most (each one model pass over the new nodes)."""
MAX_INTERVALS_FACTOR = 2
INTERVALS_MEMORY = 256 << 20
"""`_bisected` holds at most MAX_INTERVALS_FACTOR intervals per node of the batch's first
pass (each keeps z and dF/dz at both ends: twice that pass's memory), or as many as fit in
INTERVALS_MEMORY bytes where that is more; the intervals of samples that met their sum are
let go first, then a round splits only the largest errors that fit."""


def _interval_budget(grad_nodes: torch.Tensor, n_nodes: int) -> int:
    """How many intervals `_bisected` may hold, after a first pass of `n_nodes` nodes
    (S+1 times B) whose dF/dz is `grad_nodes` [(C,) S+1, B, n, ...]."""
    node_bytes = 2 * grad_nodes.numel() * grad_nodes.element_size() // n_nodes  # z, dF/dz
    return max(int(MAX_INTERVALS_FACTOR * n_nodes), INTERVALS_MEMORY // max(2 * node_bytes, 1))


def _bisected(batch: Batch, x: Any, targets: Targets, alphas: torch.Tensor,
              z_nodes: torch.Tensor, grad_nodes: torch.Tensor, difference: torch.Tensor,
              max_steps: int, max_intervals: int) -> tuple:
    """Conductance at every position [R, (C,) n, ...] and the intervals it took [R] of R
    samples `x` whose Captum sum over `alphas` [S+1] (z there [S+1, R, n, ...], dF/dz
    [(C,) S+1, R, n, ...]) missed `difference` [R] or [R, C], holding at most
    `max_intervals` intervals at a time.

    Adaptive quadrature on the path 0 -> 1 with both ends: the trapezoid rule
    (z(b) - z(a)) (dF/dz(a) + dF/dz(b)) / 2 over each interval [a, b], whose error is at
    most |sum_j (z_j(b) - z_j(a)) (dF/dz_j(b) - dF/dz_j(a))| / 2 (the rule's distance to
    either one-sided rule). Each round bisects, in every sample still missing its sum, the
    intervals whose error bound exceeds SUM_TOLERANCE / (its number of intervals) of the
    difference (at least its largest), up to `max_steps` intervals a sample, until the sum
    holds or MAX_BISECTIONS rounds. (A gap that is not the quadrature's, a path around the
    layer, never comes here: the sum does not apply.) A round's work is that of the
    intervals it splits: a sample's scores are a running total, and each interval keeps its
    bound: far fewer passes than doubling the steps, which can still miss (docs/speed.md)."""
    n_samples, point_dim = model_io.n_rows(x), neuron_dim(targets) - 1
    ends = alphas.new_tensor([0.0, 1.0]).repeat_interleave(n_samples)
    z_ends, grad_ends = _path_points(
        batch, model_io.scale_rows(model_io.repeat(x, 2), ends), repeated_targets(targets, 2))
    z_path = torch.cat([z_ends[:n_samples].unsqueeze(0), z_nodes,
                        z_ends[n_samples:].unsqueeze(0)])  # [S+3, R, n, ...]
    grad_ends = grad_ends.movedim(point_dim, 0)  # points first: [2R, (C,) n, ...]
    grad_path = torch.cat([grad_ends[:n_samples].unsqueeze(0),
                           grad_nodes.movedim((point_dim, point_dim + 1), (0, 1)),
                           grad_ends[n_samples:].unsqueeze(0)])  # [S+3, R, (C,) n, ...]
    alpha_path = torch.cat([alphas.new_zeros(1), alphas, alphas.new_ones(1)]).double()
    n_first = alpha_path.numel() - 1
    scale = difference.abs().clamp_min(SUM_FLOOR)
    intervals = _Intervals(isinstance(targets, str), scale)
    intervals.append(torch.arange(n_samples, device=alphas.device).repeat(n_first),
                     alpha_path[:-1].repeat_interleave(n_samples),
                     alpha_path[1:].repeat_interleave(n_samples),
                     z_path[:-1].flatten(0, 1), z_path[1:].flatten(0, 1),
                     grad_path[:-1].flatten(0, 1), grad_path[1:].flatten(0, 1))
    n_intervals = torch.full((n_samples,), n_first, device=alphas.device)
    for bisections in range(MAX_BISECTIONS + 1):
        attribution = intervals.total
        gap = (difference - _layer_sum(attribution, targets)) / scale
        refining = (_row_size(gap) > SUM_TOLERANCE) & (n_intervals < max_steps)
        if 2 * intervals.size > max_intervals:  # a sample's total stays: its intervals go
            intervals.keep(refining[intervals.owner])
        owner, error = intervals.owner, intervals.error * refining[intervals.owner]
        largest = torch.zeros(n_samples, dtype=error.dtype, device=error.device).scatter_reduce(
            0, owner, error, "amax")
        bar = torch.minimum(SUM_TOLERANCE / n_intervals, largest)[owner]
        chosen = ((error >= bar) & (error > 0)).nonzero()[:, 0]
        chosen = _within(chosen, owner[chosen], error[chosen], max_steps - n_intervals)
        room = max(0, max_intervals - intervals.size)  # the largest errors that fit
        chosen = chosen[error[chosen].argsort(descending=True)[:room]]
        if not len(chosen) or bisections == MAX_BISECTIONS:
            break
        split_owner, lo, hi = owner[chosen], intervals.lo[chosen], intervals.hi[chosen]
        middle = (lo + hi) / 2
        z_mid, grad_mid = _path_points(
            batch, model_io.scale_rows(model_io.take(x, split_owner), middle.to(alphas.dtype)),
            targets if isinstance(targets, str) else targets[split_owner])
        intervals.split(chosen, middle, z_mid, grad_mid.movedim(point_dim, 0))
        n_intervals += torch.bincount(split_owner, minlength=n_samples)
    return attribution.clone(), n_intervals.int()


class _Intervals:
    """`_bisected`'s intervals [lo, hi] of its samples' paths, with z and dF/dz at both ends
    (in buffers that grow by doubling, so a round's work is that of its splits), each
    interval's error bound, and per sample the trapezoid rule's total over its intervals.

    Attributes (I intervals of R samples): owner, lo, hi, error [I] (the bound as a share of
    the sample's difference, the largest over classes); z_lo, z_hi [I, n, ...]; grad_lo,
    grad_hi [I, (C,) n, ...]; total [R, (C,) n, ...]."""

    COLUMNS = ("owner", "lo", "hi", "error", "z_lo", "z_hi", "grad_lo", "grad_hi")

    def __init__(self, every_class: bool, scale: torch.Tensor):
        self.every_class, self.scale = every_class, scale
        self.size, self.buffers, self.total = 0, None, None

    def __getattr__(self, name: str) -> torch.Tensor:
        if name not in _Intervals.COLUMNS or self.buffers is None:
            raise AttributeError(name)
        return self.buffers[name][:self.size]

    def _pieces(self, z_lo, z_hi, grad_lo, grad_hi) -> tuple:
        """The trapezoid rule over intervals [K, (C,) n, ...] and their error bounds as a
        share of their samples' differences [K, (C,)]."""
        rise = (z_hi - z_lo).unsqueeze(1) if self.every_class else z_hi - z_lo
        neurons = 2 if self.every_class else 1
        bound = (rise * (grad_hi - grad_lo)).flatten(neurons).sum(-1).abs() / 2
        return rise * (grad_lo + grad_hi) / 2, bound

    def append(self, owner, lo, hi, z_lo, z_hi, grad_lo, grad_hi) -> None:
        """New intervals (their pieces join their samples' totals)."""
        pieces, bound = self._pieces(z_lo, z_hi, grad_lo, grad_hi)
        if self.total is None:
            self.total = pieces.new_zeros((len(self.scale),) + pieces.shape[1:])
        self.total.index_add_(0, owner, pieces)
        values = dict(owner=owner, lo=lo, hi=hi, error=_row_size(bound / self.scale[owner]),
                      z_lo=z_lo, z_hi=z_hi, grad_lo=grad_lo, grad_hi=grad_hi)
        count = len(owner)
        if self.buffers is None or self.size + count > len(self.buffers["owner"]):
            capacity = max(2 * (self.size + count), 64)
            grown = {name: value.new_empty((capacity,) + value.shape[1:])
                     for name, value in values.items()}
            for name in grown if self.size else ():
                grown[name][:self.size] = getattr(self, name)
            self.buffers = grown
        for name, value in values.items():
            self.buffers[name][self.size:self.size + count] = value
        self.size += count

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the intervals `rows` (bool [I]); the samples' totals stay as they are."""
        self.buffers = {name: getattr(self, name)[rows] for name in _Intervals.COLUMNS}
        self.size = len(self.buffers["owner"])

    def split(self, index: torch.Tensor, middle: torch.Tensor, z_mid: torch.Tensor,
              grad_mid: torch.Tensor) -> None:
        """Split intervals `index` [K] at `middle` [K] (z there [K, n, ...], dF/dz
        [K, (C,) n, ...]): each becomes its left half, and its right half is appended."""
        owner, hi = self.owner[index], self.hi[index]
        z_lo, z_hi, grad_lo, grad_hi = (self.z_lo[index], self.z_hi[index],
                                        self.grad_lo[index], self.grad_hi[index])
        self.total.index_add_(0, owner, self._pieces(z_lo, z_hi, grad_lo, grad_hi)[0],
                              alpha=-1)
        pieces, bound = self._pieces(z_lo, z_mid, grad_lo, grad_mid)
        self.total.index_add_(0, owner, pieces)
        self.hi[index], self.z_hi[index], self.grad_hi[index] = middle, z_mid, grad_mid
        self.error[index] = _row_size(bound / self.scale[owner])
        self.append(owner, middle, hi, z_mid, z_hi, grad_mid, grad_hi)


def _within(chosen: torch.Tensor, owner: torch.Tensor, error: torch.Tensor,
            room: torch.Tensor) -> torch.Tensor:
    """The intervals `chosen` (of samples `owner`), keeping in each sample only its `room`
    [R] largest `error`s."""
    by_error = torch.argsort(error, descending=True)
    order = by_error[torch.argsort(owner[by_error], stable=True)]  # by sample, largest first
    owner = owner[order]
    counts = torch.bincount(owner, minlength=len(room))
    rank = torch.arange(len(order), device=order.device) - (counts.cumsum(0) - counts)[owner]
    return chosen[order[rank < room[owner]]]


def _path_points(batch: Batch, points: Any, targets: Targets) -> tuple:
    """z [P, n, ...] and dF/dz [(C,) P, n, ...] at P points of a path (inputs [P, ...]; one
    target each [P], or "all"), in passes of at most `batch.max_rows` rows."""
    n_points, zs, grads = model_io.n_rows(points), [], []
    for begin in range(0, n_points, batch.max_rows):
        part = slice(begin, min(n_points, begin + batch.max_rows))
        z, logits = batch.runner.forward_with_leaf(model_io.take(points, part))
        grads.append(target_gradients(
            batch, logits, z, targets if isinstance(targets, str) else targets[part]).detach())
        zs.append(z.detach())
    return torch.cat(zs), torch.cat(grads, dim=1 if isinstance(targets, str) else 0)


def _broadcast_rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A bool [R] shaped to broadcast over `like` [R, ...]."""
    return rows.view((-1,) + (1,) * (like.dim() - 1))

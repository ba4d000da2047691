"""What a pruning curve will cost, said before it runs, with the cheaper settings a user can
trade for speed (fewer random orders, coarser k, a sample of the data).

A curve's time is the front of the model once over the samples, then one masked pass of the
layer's tail per distinct removal mask (`pruning_curves._order_sums` shares masks between orders):
(2 + n_random) orders x the k values, less the masks they share (k = 0, k = n). Both parts
are timed on a batch of the user's own samples (`batch_size` of them, as the curve runs
them: a smaller probe would scale a batch's fixed cost by the number of probes; more masks
where a few are too quick to time), through the same engine, and scaled by the number of
samples: a linear model of the work, stated as an estimate.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_SEED
from ..engine.model_io import n_rows, named, take
from ..methods.passes import LayerPass
from .pruning_curves import _removal_masks, check_ks, order_curves, random_orders, spaced_ks

PROBE_RUNS = 5
"""The most timed runs of each of `curve_cost`'s probes."""
MEASURABLE_SECONDS = 0.05
"""The least time the passes a probe adds must take for their share to be read from it
(`curve_cost`'s masks, `oracle_sample.oracle_timing`'s neurons): four cheap neurons add a
millisecond, which the noise of two runs outweighs (a curve planned at a twentieth of its
time)."""
PROBE_SECONDS = 8.0
"""What `curve_cost`'s probe of several orders may take: where one masked pass of the first
batch makes it longer, it runs on fewer of the batch's samples (an eighth at the least), so
that sizing a curve costs a small part of its budget (a wide, deep tail: GPT-2 small's h.6
MLP took over 3 min to price a 2 min curve on a whole batch)."""
SMALLEST_PROBE_SHARE = 8
"""`curve_cost`'s probe keeps at least 1/SMALLEST_PROBE_SHARE of the first batch."""
MOST_PROBE_ORDERS = 128
"""The most random orders `curve_cost`'s probe grows to while their passes are too quick
to time."""
WORTH_SAYING_SECONDS = 5.0
"""A curve estimated to take longer than this comes with its cheaper settings."""
CHEAPER_N_RANDOM = 5
CHEAPER_K_POINTS = 8
CHEAPER_SAMPLES = 200


@dataclass(frozen=True)
class Cheaper:
    """A setting that makes the curve cheaper: `option` (the command line's flag and value),
    `setting` (its words for the dashboard; None where the dashboard has no such control),
    and the estimated seconds with it."""

    option: str
    setting: Optional[str]
    seconds: float


@dataclass(frozen=True)
class CurveCost:
    """The estimated cost of a pruning curve.

    Attributes:
        seconds: estimated wall time.
        n_samples, n_neurons, n_orders, n_ks: its size (orders: ranked, bottom, random).
        masks: distinct removal masks, each one masked pass of the tail over the samples
            (with exact ablation, one more per neuron).
        front_share: the share of the time spent in the front (the model up to the layer).
        cheaper: settings that cost less (empty when the curve is quick anyway).
        priced_in: the seconds this estimate took (a budget for the whole wait, as the
            Pruning page's, takes them off).
    """

    seconds: float
    n_samples: int
    n_neurons: int
    n_orders: int
    n_ks: int
    masks: int
    front_share: float
    cheaper: tuple[Cheaper, ...]
    priced_in: float = 0.0

    def seconds_of_masks(self, count: int) -> float:
        """The estimated seconds of `count` masked passes of the tail over the samples (e.g.
        exact ablation's, one per neuron)."""
        return self.seconds * (1 - self.front_share) * count / max(self.masks, 1)

    def words(self, command_line: bool = False) -> str:
        """One paragraph: the cost ("about 14 s", an estimate), where the time goes, and the
        cheaper settings (as command-line flags, or in words for the dashboard's controls)."""
        said = (f"{seconds_words(self.seconds)}: {self.n_orders} removal orders x "
                f"{self.n_ks} values of k on {self.n_samples} samples, {self.masks} masked "
                f"passes of the layer's tail ({1 - self.front_share:.0%} of the time; the model "
                "up to the layer runs once)")
        offered = [(choice.option if command_line else choice.setting, choice.seconds)
                   for choice in self.cheaper]
        offered = [(words, seconds) for words, seconds in offered if words]
        if offered:
            said += "; cheaper: " + ", ".join(f"{words} ({seconds_words(seconds)})"
                                              for words, seconds in offered)
        return said + "."


def curve_cost(model: nn.Module, layer, inputs, targets=None, *,
               ks: Union[Sequence[int], Callable[[int], list[int]], None] = None,
               n_random: int = 20, seed: int = DEFAULT_SEED,
               batch_size: int = DEFAULT_BATCH_SIZE, device=None,
               exact_ablation: bool = False) -> CurveCost:
    """The cost of `pruning_curve(model, layer, inputs, targets, ..., ks=ks,
    n_random=n_random)`, timed on the first batch of samples (in-memory inputs: a tensor,
    array or named inputs). `ks` may be a rule of the layer's
    neuron count (e.g. `settings.evidence_ks`: then coarser k is not offered);
    `exact_ablation` adds one masked pass per neuron (`diagnose` ablates every neuron beside
    its curve)."""
    started = time.perf_counter()
    n_samples = n_rows(inputs)
    probe_rows = min(batch_size, n_samples)
    probe = take(inputs, slice(0, probe_rows))
    probe_targets = None if targets is None or isinstance(targets, str) else \
        targets[:probe_rows]
    n_neurons = layer_width(model, layer, probe, device)
    offer_ks = not callable(ks)
    ks = check_ks(ks(n_neurons) if callable(ks) else ks, n_neurons)
    front, per_mask, probe_rows = _probe(model, layer, probe, probe_targets, batch_size,
                                         device, n_neurons,
                                         distinct_masks(n_neurons, n_random, ks, seed))

    def seconds(n_random: int, ks: list[int], rows: int) -> tuple[float, int]:
        masks = distinct_masks(n_neurons, n_random, ks, seed) + n_neurons * exact_ablation
        return (front + masks * per_mask) * rows / probe_rows, masks

    total, masks = seconds(n_random, ks, n_samples)
    cheaper = []
    if total > WORTH_SAYING_SECONDS:
        if n_random > CHEAPER_N_RANDOM:
            cheaper.append(Cheaper(f"--n-random {CHEAPER_N_RANDOM}",
                                   f"{CHEAPER_N_RANDOM} random orders",
                                   seconds(CHEAPER_N_RANDOM, ks, n_samples)[0]))
        if offer_ks and len(ks) > CHEAPER_K_POINTS + 1:
            coarse = spaced_ks(n_neurons, CHEAPER_K_POINTS)
            cheaper.append(Cheaper(f"--ks {','.join(map(str, coarse))}",
                                   f"{len(coarse)} values of k",
                                   seconds(n_random, coarse, n_samples)[0]))
        if n_samples > CHEAPER_SAMPLES:
            cheaper.append(Cheaper(f"--sample {CHEAPER_SAMPLES}", None,
                                   seconds(n_random, ks, CHEAPER_SAMPLES)[0]))
    return CurveCost(seconds=total, n_samples=n_samples, n_neurons=n_neurons,
                     n_orders=2 + n_random, n_ks=len(ks), masks=masks,
                     front_share=front / max(front + masks * per_mask, 1e-12),
                     cheaper=tuple(cheaper), priced_in=time.perf_counter() - started)


CURVE_SECONDS = 30.0
"""The time an analysis's own pruning curve (diagnose's evidence curve) may take when its
size is not given: its full size when it fits, else fewer k values and then a share of the
samples (`plan_curve`)."""
FEWEST_CURVE_POINTS = 8
"""The fewest k steps a curve sized to a budget keeps (CHEAPER_K_POINTS: the shape of the
curve and its area, at a ninth of 64 steps' masks)."""


@dataclass(frozen=True)
class CurvePlan:
    """A pruning curve sized to a budget: `points` k steps (`spaced_ks`) of `n_random`
    random orders, on `share` of each cluster's samples (`draw_samples`: `samples` of the
    `n_samples`), estimated at `seconds`; `full_points` and `full_seconds` are the size
    asked and its estimate (`plan_curve`)."""

    points: int
    n_random: int
    share: float
    samples: int
    n_samples: int
    seconds: float
    full_points: int
    full_seconds: float
    budget: float = CURVE_SECONDS

    @property
    def reduced(self) -> bool:
        return self.points < self.full_points or self.share < 1

    def ks(self, n_neurons: int) -> list[int]:
        return spaced_ks(n_neurons, self.points)

    def words(self, n_neurons: int, measured: Optional[tuple[int, int]] = None,
              whose: str = "the") -> str:
        """"at 9 values of k on 40 of the 256 samples, drawn at random: as many as fit in
        30 s (the full curve: about 2.1 h)"; "" when it is the full curve. `measured`:
        (samples, of how many) of one cluster's curve instead of the plan's over all,
        said as `whose` samples ("the cluster's")."""
        if not self.reduced:
            return ""
        samples, total = measured or (self.samples, self.n_samples)
        said = f"at {len(self.ks(n_neurons))} values of k"
        if samples < total:
            said += f" on {samples:,} of {whose} {total:,} samples, drawn at random"
        return (f"{said}: as many as fit in {self.budget:.0f} s (the full curve: "
                f"{seconds_words(self.full_seconds)})")


def plan_curve(fixed: float, per_pass: float, n_neurons: int, codes: np.ndarray,
               n_random: int, points: int, budget: Optional[float] = None,
               seed: int = DEFAULT_SEED) -> CurvePlan:
    """The curve of `n_random` random orders at `points` k steps on the samples of cluster
    `codes` [N], sized to `budget` seconds: each mask one masked pass of the layer's tail
    (`per_pass` seconds over every sample) after the front (`fixed`), as
    `oracle_sample.oracle_timing` times them. The full size when it fits; else the k steps
    halved down to FEWEST_CURVE_POINTS; then the share of each cluster's samples that fits
    (`draw_samples`, at least FEWEST_SAMPLES of each). budget None: CURVE_SECONDS."""
    budget = CURVE_SECONDS if budget is None else budget

    def seconds(steps: int) -> float:
        return fixed + per_pass * distinct_masks(n_neurons, n_random,
                                                 spaced_ks(n_neurons, steps), seed)

    full = seconds(points)
    steps, cost = points, full
    while cost > budget and min(steps, n_neurons) > FEWEST_CURVE_POINTS:
        steps = max(FEWEST_CURVE_POINTS, min(steps, n_neurons) // 2)
        cost = seconds(steps)
    share, samples = fitting_share(cost, budget, codes, seed)
    return CurvePlan(steps, n_random, share, samples, len(codes),
                     cost * samples / max(len(codes), 1), points, full, budget)


def distinct_masks(n_neurons: int, n_random: int, ks: Sequence[int], seed: int) -> int:
    """Distinct removal masks of the ranked, bottom and `n_random` seeded random orders at
    `ks` (a ranking and its reverse stand for any scores: the masks they share are k = 0 and
    k = n)."""
    ranked = torch.arange(n_neurons)
    return _count_masks(torch.cat([ranked[None], ranked.flip(0)[None],
                                   random_orders(n_neurons, n_random, seed)]), ks)


def _count_masks(orders: torch.Tensor, ks: Sequence[int]) -> int:
    """Distinct removal masks of `orders` [O, n] at `ks`: the masked passes they cost."""
    return int(torch.unique(_removal_masks(orders, list(ks)).reshape(-1, orders.shape[1]),
                            dim=0).shape[0])


def _probe(model, layer, probe, targets, batch_size: int, device, n_neurons: int,
           most_masks: int) -> tuple[float, float, int]:
    """(seconds of the front, seconds per masked tail pass, on how many samples) on `probe`
    [rows, ...]: a curve of one order at k = 0 (the front and one pass), then of the ranked,
    bottom and two random orders at eight k (the front and up to 32 passes), four times as
    many random orders until their passes add MEASURABLE_SECONDS (or would pass a quarter of
    the `most_masks` of the curve priced); the difference is the passes'. Both run on as
    many of the probe's samples as keep 32 passes of the first curve's time within
    PROBE_SECONDS (at least 1/SMALLEST_PROBE_SHARE of them), read from that first curve
    timed on the fewest: a slow tail never runs a pass of the whole probe. The fastest of
    up to PROBE_RUNS runs of each (`fastest`: short timings are the noisy ones, and cheap
    to repeat)."""
    def timed(rows: int, orders_of, ks_of) -> tuple[float, int]:
        x, x_targets = take(probe, slice(0, rows)), None if targets is None else targets[:rows]
        best = fastest(lambda: order_curves(model, layer, x, x_targets, orders_of, ks_of,
                                             batch_size=batch_size, device=device),
                        PROBE_RUNS)
        return best, _count_masks(orders_of, ks_of)

    ranked = torch.arange(n_neurons)
    fewest = -(-n_rows(probe) // SMALLEST_PROBE_SHARE)
    one, one_masks = timed(fewest, ranked[None], [0])
    rows = min(n_rows(probe), max(fewest, math.floor(fewest * PROBE_SECONDS
                                                     / max(32 * one, 1e-9))))
    if rows > fewest:  # a quick tail: timed on more samples (all, where they fit)
        one, one_masks = timed(rows, ranked[None], [0])
    ks = sorted({min(n_neurons, k) for k in range(1, 9)})
    n_random = 2
    while True:
        orders = torch.cat([ranked[None], ranked.flip(0)[None],
                            random_orders(n_neurons, n_random, DEFAULT_SEED)])
        several, masks = timed(rows, orders, ks)
        if several - one >= MEASURABLE_SECONDS or 16 * masks > most_masks or \
                n_random >= MOST_PROBE_ORDERS:  # four times as many would pass a quarter
            break
        n_random *= 4
    per_mask = max(several - one, 0.0) / max(masks - one_masks, 1)
    return max(one - per_mask, 0.0), per_mask, rows


def layer_width(model, layer, probe, device) -> int:
    """The layer's neurons: its output's neuron axis, captured for one sample."""
    layer_pass = LayerPass(model, layer, take(probe, slice(0, 1)), None, batch_size=1,
                           device=device, grad=False)
    (_, z), = layer_pass.run(lambda batch: batch.runner.capture(batch.x)[0])
    return int(z.shape[1])


def seconds_words(value: float) -> str:
    """An estimate in words: "under 1 s", "about 4.9 s", "about 14 s", "about 7 min",
    "about 4.5 h"."""
    if value < 1:
        return "under 1 s"
    if value < 120:
        return f"about {value:.1f} s" if value < 10 else f"about {value:.0f} s"
    return f"about {value / 60:.0f} min" if value < 7200 else f"about {value / 3600:.1f} h"


@dataclass(frozen=True)
class SampledCost:
    """`sampled_cost`'s estimate: `seconds`, the samples, the sizes it timed, and whether
    `seconds` is an upper bound (`bound`: a quick work, timed on one sample only)."""

    what: str
    seconds: float
    n_samples: int
    timed: tuple[int, ...]
    bound: bool = False
    planned: tuple[tuple[str, float], ...] = ()
    """(what, seconds) of the parts sized by a plan (exact ablation, an evidence curve),
    already in `seconds`: estimated by the plan that sized them, not timed here."""

    def with_planned(self, *parts: tuple[str, float]) -> "SampledCost":
        """This cost with the `parts` a plan sized, (what, seconds) each, added."""
        return replace(self, seconds=self.seconds + sum(seconds for _, seconds in parts),
                       planned=self.planned + tuple(parts))

    def words(self) -> str:
        sizes = " and ".join(map(str, self.timed))
        timed = self.seconds - sum(seconds for _, seconds in self.planned)
        if self.bound:
            said = f"at most {max(self.seconds, 1):.0f} s"
            how = (f"{self.what} timed on {sizes} of the {self.n_samples} samples, every "
                   "cluster kept, and scaled up: an upper bound")
        else:
            said = seconds_words(self.seconds)
            how = (f"{self.what} timed on {sizes} of the {self.n_samples} samples, every "
                   "cluster kept, and extrapolated")
        if not self.planned:
            return f"{said} ({how})"
        parts = ", ".join(f"{what} {seconds_words(seconds)}" for what, seconds in self.planned)
        return f"{said}: {parts} as planned, and {seconds_words(timed)} more ({how})"


COST_PROBE_ROWS = 64
"""The fewest samples `sampled_cost` times (all of them, where there are fewer)."""
SAMPLED_RUNS = 2
"""The most timed runs of each of `sampled_cost`'s samples, the fastest kept: on a busy
machine one run can take twice another, and the extrapolation multiplies the difference."""
REPEAT_WHILE_SECONDS = 0.5
"""A timing is repeated (up to its number of runs) only while all its runs took less than
this: a short timing is the noisy one, and a long one is not worth paying twice."""
LARGE_SHARE = 20
"""`sampled_cost`'s larger sample: about 1/LARGE_SHARE of the samples, in whole batches."""


def fastest(work: Callable[[], Any], runs: int) -> float:
    """The fastest of up to `runs` timed runs of `work`, stopping once they took
    REPEAT_WHILE_SECONDS in all."""
    best, spent = math.inf, 0.0
    for _ in range(runs):
        started = time.perf_counter()
        work()
        took = time.perf_counter() - started
        best, spent = min(best, took), spent + took
        if spent >= REPEAT_WHILE_SECONDS:
            break
    return best


def probe_sizes(total: int, batch_size: int) -> tuple[int, int]:
    """The two sample sizes `sampled_cost` times for a work on `total` samples in batches of
    `batch_size`. Whole batches where there are two or more: a part of a batch, or a run's
    first batch alone, runs at another speed per sample (timed on parts of a batch, a
    diagnosis was priced at several times its time), so one batch, then at least
    two (about 1/LARGE_SHARE of the samples), the two together at most a quarter of the
    work. Where that leaves no room for the larger, or there is less than two batches, the
    same size twice (an eighth of the samples, at least COST_PROBE_ROWS, below two
    batches)."""
    if total >= 2 * batch_size:
        room = (total // 4 - batch_size) // batch_size
        wanted = max(2, total // LARGE_SHARE // batch_size)
        return batch_size, (min(wanted, room) if room >= 2 else 1) * batch_size
    small = min(total, max(COST_PROBE_ROWS, total // 8))
    return small, small


def part_sizes(total: int, batch_size: int) -> Optional[tuple[int, int]]:
    """The sizes `sampled_cost` times a work's part on when `probe_sizes` would time one
    size twice (less than two batches: its time scaled up is an upper bound, the fixed part
    scaled with it), so that the part is extrapolated: an eighth and a quarter of the
    samples; None where `probe_sizes` has two sizes."""
    small, large = probe_sizes(total, batch_size)
    return None if large > small else (max(1, total // 8), max(2, total // 4))


def sampled_cost(what: str, run: Callable[[Callable], Any], inputs, clusters=None,
                 batch_size: int = DEFAULT_BATCH_SIZE,
                 sizes: Optional[tuple[int, int]] = None) -> SampledCost:
    """The seconds of a work on all of `inputs`, said before it runs: `run(sample)` does the
    work on the rows that `sample` takes (`sample(value)`: those rows of the inputs or of
    any per-sample value, [N, ...]; None and words such as "all" as they are). It runs
    untimed on two samples a cluster (what is done once per model), then timed on the
    smaller of `sizes` (None: `probe_sizes`), each sample keeping every cluster in
    proportion (the fastest of SAMPLED_RUNS runs). That time scaled to every sample is an
    upper bound (the work's fixed part and its first batch's start are scaled too); it is
    said as one where it is under WORTH_SAYING_SECONDS or there is no larger size to time.
    Otherwise the work is timed on the larger size too and extrapolated linearly; given
    `sizes` (parts of a batch, whose fixed part an upper bound would scale many times), it
    always is. In-memory inputs only (a tensor, an array or named inputs)."""
    total = n_rows(named(inputs))
    codes = cluster_codes_of(clusters, total)

    def timed(rows: int, runs: int = SAMPLED_RUNS) -> tuple[int, float]:
        part = stratified(codes, rows)
        return len(part), fastest(lambda: run(lambda value: take_rows(value, part)), runs)

    timed(2, runs=1)  # pays what is done once per model
    small, large = sizes or probe_sizes(total, batch_size)
    small, first = timed(small)
    if small >= total:
        return SampledCost(what, first, total, (small,))
    if large <= small or (sizes is None and first * total / small < WORTH_SAYING_SECONDS):
        return SampledCost(what, first * total / small, total, (small,), bound=True)
    large, second = timed(large)
    if large <= small:  # every cluster's two samples are all the larger size takes
        return SampledCost(what, first * total / small, total, (small,), bound=True)
    slope = max(second - first, 0.0) / (large - small)
    return SampledCost(what, max(first + slope * (total - small), second), total,
                       (small, large))


FEWEST_SAMPLES = 8
"""The fewest samples of each cluster that an analysis measuring a share of them measures
(all of a smaller cluster): a sampled oracle, a sampled evidence curve."""


def cluster_codes_of(clusters, total: int) -> np.ndarray:
    """int64 [N]: the code of each sample's cluster in `clusters` [N] (None: one cluster)."""
    if clusters is None:
        return np.zeros(total, dtype=np.int64)
    return pd.factorize(np.asarray(clusters))[0].astype(np.int64)


def draw_samples(codes: np.ndarray, share: float, seed: int = DEFAULT_SEED) -> np.ndarray:
    """int64 [s]: sorted positions of samples drawn at random without replacement, `share`
    of each cluster of `codes` [N] (rounded, at least FEWEST_SAMPLES of each, all of a
    smaller one); every position when share >= 1. The same seed draws the same samples."""
    codes = np.asarray(codes)
    if share >= 1:
        return np.arange(len(codes), dtype=np.int64)
    keys = np.random.default_rng([seed, len(codes)]).random(len(codes))  # one per sample:
    picked = [np.empty(0, dtype=np.int64)]  # the same draw whatever the clusters are called
    for code in np.unique(codes):
        members = np.flatnonzero(codes == code)
        size = min(len(members), max(FEWEST_SAMPLES, round(share * len(members))))
        picked.append(members[np.argsort(keys[members], kind="stable")[:size]])
    return np.sort(np.concatenate(picked)).astype(np.int64)


def fitting_share(seconds: float, budget: float, codes: np.ndarray,
                  seed: int = DEFAULT_SEED) -> tuple[float, int]:
    """(the share of each cluster's samples, of `codes` [N], that a work of `seconds` on
    every sample may measure within `budget`: 1 where it fits; how many samples
    `draw_samples` then draws, its floors included)."""
    share = 1.0 if seconds <= budget else budget / seconds
    samples = len(draw_samples(codes, share, seed))
    return (1.0 if samples >= len(codes) else share), samples


def take_rows(value, rows: np.ndarray):
    """`value`'s `rows` (inputs, a tensor, an array, a list or a Series [N, ...]); None or a
    word as it is."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, pd.Series, pd.Index)):
        value = np.asarray(value)
    value = named(value)
    if isinstance(value, np.ndarray):
        return value[rows]  # labels, cluster ids and inputs alike, any dtype
    return take(value, torch.from_numpy(rows))


def stratified(codes: np.ndarray, rows: int) -> np.ndarray:
    """Sorted positions of about `rows` samples, from every cluster of `codes` [N] in
    proportion and at least two of each (all of a smaller cluster), first ones first."""
    picked = []
    for code in np.unique(codes):
        members = np.flatnonzero(codes == code)
        share = max(2, round(rows * len(members) / len(codes)))
        picked.append(members[:share])
    return np.sort(np.concatenate(picked))

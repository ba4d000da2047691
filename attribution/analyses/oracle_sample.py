"""Exact ablation on a random sample of a layer's neurons, and the agreement statistics that
read it, with intervals over both draws.

Exact single-neuron ablation is one masked pass of the layer's tail per neuron: on a 3,072
neuron MLP of GPT-2, hours. `sample_oracle` ablates m neurons drawn at random, m chosen
from a time budget (`oracle_size`: all n when they fit, and then every statistic is the
exact one), and `sampled_agreement` compares a ranking with it on those m neurons. Its
interval accounts for both draws: the samples, resampled with replacement as everywhere in
the package, and the neurons, by Gross's (1980) bootstrap of a finite population (the m
replicated to n, m drawn from them without replacement), so the neuron part narrows as m
grows and vanishes at m = n.

Where even FEWEST_ORACLE_NEURONS neurons (every neuron of a narrower layer) pass the budget
on every sample (a deep tail over long sequences, or very many samples), the oracle
measures a share of each cluster's samples too, drawn at random (`costs.draw_samples`); the
statistics then read the method's scores on those samples, resampled as a sample of the
cluster's (`sample_counts_of`), with the pivotal interval (`ranks.pivot_interval`).

On m of n neurons the statistics read the m pairs (method score, oracle) the way the exact
ones read all n: Spearman and Kendall of the pairs; the top-k overlap as the share of the
oracle's top k_m = round(k m / n) of the m (its top 10% of them, for k its top 10%) that
the method, which scores every neuron, puts in its top k of n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional, Union

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_SEED
from ..engine.model_io import n_rows, take
from ..errors import AttributionError
from ..methods.passes import Progress
from ..methods.scores import (ClusterStatistics, Inputs, ScoreFacts, neuron_scores,
                              reduce_scores)
from .costs import (MEASURABLE_SECONDS, cluster_codes_of, draw_samples, fastest,
                    fitting_share, layer_width, seconds_words)
from .ranks import (bootstrap_counts, interval, pivot_interval, rank_correlation,
                    row_kendall, row_ranks, row_spearman, row_top_overlap, top_k_overlap)

ORACLE_SECONDS = 30.0
"""The time exact ablation may take when its size is not given: all neurons when they fit,
else as many as fit (`oracle_size`)."""
FEWEST_ORACLE_NEURONS = 32
"""The fewest neurons a sampled oracle ablates, whatever the budget (all, when fewer): a
rank correlation on fewer says little."""
PROBE_NEURONS = 4
"""Neurons ablated beyond one, on one batch, to time the oracle (`oracle_timing`): at
first; more where their time is lost in the timing's noise."""
TIMING_RUNS = 5
"""The most timed runs of each of `oracle_timing`'s probes, the fastest kept (they stop
after `costs.REPEAT_WHILE_SECONDS`: a long probe runs once)."""


@dataclass(frozen=True)
class OracleSample:
    """Exact single-neuron ablation of m of a layer's n neurons.

    Attributes:
        neurons: the neurons ablated, int64 [m], sorted (all n: `exact`).
        n_neurons: n, the layer's neurons.
        effects: float32 [N, m]: per sample, the drop of the target when each alone is
            zeroed (the `ablation` method's scores of those neurons).
        layer: the layer's neuron axis as the ablation saw it (`runners.layer_attrs`).
        samples: the positions of the samples measured among those given, int64 [s],
            sorted (effects [s, m]); None: every sample (effects [N, m]).
    """

    neurons: np.ndarray
    n_neurons: int
    effects: np.ndarray
    layer: dict = field(default_factory=dict)
    samples: Optional[np.ndarray] = None

    @property
    def exact(self) -> bool:
        return len(self.neurons) == self.n_neurons and self.samples is None

    def rows(self, rows: np.ndarray) -> "OracleSample":
        """The same neurons on the samples `rows` only (positions among those given);
        `samples` then counts among `rows`."""
        if self.samples is None:
            return replace(self, effects=self.effects[rows])
        measured = np.isin(rows, self.samples)
        return replace(self, effects=self.effects[np.searchsorted(self.samples, rows[measured])],
                       samples=np.flatnonzero(measured))

    def of(self, values: np.ndarray) -> np.ndarray:
        """The rows of per-sample `values` [N, ...] that the oracle measured [s, ...]."""
        return values if self.samples is None else values[self.samples]

    def words(self) -> str:
        """"on 256 of 3,072 neurons" (sampled) or "on all 64 neurons"."""
        if self.exact:
            return f"on all {self.n_neurons:,} neurons"
        return f"on {len(self.neurons):,} of {self.n_neurons:,} neurons"


def draw_neurons(n_neurons: int, size: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """int64 [min(size, n)]: neurons drawn at random without replacement, sorted; all of
    them (0..n-1) when size >= n. The same seed draws the same neurons."""
    if size >= n_neurons:
        return np.arange(n_neurons, dtype=np.int64)
    if size < 1:
        raise AttributionError("An oracle needs at least one neuron.")
    generator = np.random.default_rng([seed, n_neurons, size])
    return np.sort(generator.choice(n_neurons, size, replace=False)).astype(np.int64)


def oracle_size(n_neurons: int, seconds_per_neuron: float,
                budget: Optional[float] = None, fixed_seconds: float = 0.0) -> int:
    """m for a layer of n neurons, each ablation taking `seconds_per_neuron` over the
    samples after `fixed_seconds` any size pays: n when all fit `budget` (None:
    ORACLE_SECONDS); else the largest power of two that fits (a size that the same model
    gives again from one timing to the next), at least FEWEST_ORACLE_NEURONS, at most n."""
    budget = (ORACLE_SECONDS if budget is None else budget) - fixed_seconds
    if seconds_per_neuron * n_neurons <= budget:
        return n_neurons
    fits = budget / max(seconds_per_neuron, 1e-12)
    size = 2 ** int(math.floor(math.log2(fits))) if fits >= 1 else 1
    return int(min(n_neurons, max(FEWEST_ORACLE_NEURONS, size)))


def oracle_timing(model: nn.Module, layer, inputs: Inputs, targets=None, *,
                  batch_size: int = DEFAULT_BATCH_SIZE,
                  device=None) -> tuple[float, float, int]:
    """(seconds of the passes every oracle pays, seconds per neuron ablated, the layer's n),
    over all the samples: exact ablation of 1 and of 1 + PROBE_NEURONS neurons timed on one
    batch (after one neuron on two samples has built the runner; four times as many until
    they add MEASURABLE_SECONDS, or every neuron), the difference the neurons' share, the
    rest the fixed part (the model up to the layer, once per batch), both scaled by the
    number of samples. In-memory inputs only."""
    total = n_rows(inputs)
    n_neurons = layer_width(model, layer, inputs, device)
    rows = min(total, batch_size)
    probe = take(inputs, slice(0, rows))
    probe_targets = None if targets is None else targets[:rows]
    options = dict(batch_size=batch_size, device=device)
    neuron_scores(model, layer, take(inputs, slice(0, min(total, 2))), None if targets is None
                  else targets[:min(total, 2)], "ablation", neurons=[0], **options)

    def seconds(count: int) -> float:
        return fastest(lambda: neuron_scores(model, layer, probe, probe_targets, "ablation",
                                              neurons=np.arange(count), **options),
                        TIMING_RUNS)

    extra = min(PROBE_NEURONS, n_neurons - 1)
    one = seconds(1)
    more = seconds(1 + extra) if extra else 2 * one
    while more - one < MEASURABLE_SECONDS and extra < n_neurons - 1:
        extra = min(4 * extra, n_neurons - 1)
        more = seconds(1 + extra)
    per_neuron = max(more - one, 0.0) / extra if extra else one
    scale = total / rows
    return max(one - per_neuron, 0.0) * scale, per_neuron * scale, n_neurons


@dataclass(frozen=True)
class OraclePlan:
    """The oracle an analysis not told its size runs: `neurons` of the layer's `n_neurons`,
    each ablation taking `seconds_per_neuron` over every sample after `fixed_seconds` that
    any size pays, on `share` of each cluster's samples (`draw_samples`: `samples` of the
    `n_samples`; 1 and all of them unless even FEWEST_ORACLE_NEURONS, or every neuron of a
    narrower layer, pass the budget on every sample)
    (`plan_oracle`)."""

    neurons: int
    n_neurons: int
    seconds_per_neuron: float
    fixed_seconds: float = 0.0
    budget: float = ORACLE_SECONDS
    share: float = 1.0
    samples: int = 0
    n_samples: int = 0

    @property
    def exact(self) -> bool:
        return self.neurons >= self.n_neurons and self.share >= 1

    def exactly(self, neurons: Optional[int] = None) -> "OraclePlan":
        """This plan ablating `neurons` (None, or the layer's n or more: every one) on every
        sample: a user's choice where the budget drew fewer."""
        size = self.n_neurons if neurons is None else min(int(neurons), self.n_neurons)
        return replace(self, neurons=size, share=1.0, samples=self.n_samples)

    @property
    def exact_seconds(self) -> float:
        """The estimated time of exact ablation of every neuron on every sample."""
        return self.fixed_seconds + self.seconds_per_neuron * self.n_neurons

    @property
    def seconds(self) -> float:
        """The estimated time of this oracle (`neurons` of them, on its samples)."""
        measured = self.samples / self.n_samples if self.share < 1 and self.n_samples else 1.0
        return (self.fixed_seconds + self.seconds_per_neuron * self.neurons) * measured

    def words(self) -> str:
        """"256 of the 3,072 neurons, drawn at random: as many as exact ablation fits in 30 s
        (every neuron: about 41 min)"; "every one of the 64 neurons" when they all fit; the
        samples too where only a share of them fit ("32 of the 3,072 neurons on 48 of the
        256 samples, drawn at random (...) ...")."""
        if self.exact:
            return f"every one of the {self.n_neurons:,} neurons"
        measured = (f" on {self.samples:,} of the {self.n_samples:,} samples" if self.share < 1
                    else "")
        every = "every neuron on every sample" if self.share < 1 else "every neuron"
        return (f"{self.neurons:,} of the {self.n_neurons:,} neurons{measured}, drawn at "
                f"random: as many as exact ablation fits in {self.budget:.0f} s ({every}: "
                f"{seconds_words(self.exact_seconds)})")


def plan_oracle(model: nn.Module, layer, inputs: Inputs, targets=None, clusters=None, *,
                budget: Optional[float] = None, batch_size: int = DEFAULT_BATCH_SIZE,
                seed: int = DEFAULT_SEED, device=None) -> OraclePlan:
    """How many neurons an oracle not told its size ablates on these inputs, and on what
    share of each cluster of `clusters` [N] (None: one cluster): `oracle_size` of the
    timing `oracle_timing`, and where even that many pass `budget` on every sample, the
    share of the samples that fits. A front end resolves it once and passes it to the
    estimate and to the work, so both ablate the same neurons on as many samples (and can
    offer every neuron, `OraclePlan.exact_seconds`)."""
    budget = ORACLE_SECONDS if budget is None else budget
    fixed, per_neuron, n_neurons = oracle_timing(model, layer, inputs, targets,
                                                 batch_size=batch_size, device=device)
    return plan_of_timing(fixed, per_neuron, n_neurons,
                          cluster_codes_of(clusters, n_rows(inputs)), budget, seed)


def plan_of_timing(fixed: float, per_neuron: float, n_neurons: int, codes: np.ndarray,
                   budget: Optional[float] = None, seed: int = DEFAULT_SEED) -> OraclePlan:
    """`plan_oracle` of a timing (`oracle_timing`'s) on samples of cluster `codes` [N]
    (budget None: ORACLE_SECONDS)."""
    budget = ORACLE_SECONDS if budget is None else budget
    size = oracle_size(n_neurons, per_neuron, budget, fixed)
    share, samples = fitting_share(fixed + per_neuron * size, budget, codes, seed)
    return OraclePlan(size, n_neurons, per_neuron, fixed, budget, share, samples, len(codes))


def sample_oracle(model: nn.Module, layer, inputs: Inputs, targets=None,
                  neurons: Union[int, OraclePlan, None] = None, clusters=None, *,
                  budget: Optional[float] = None, batch_size: int = DEFAULT_BATCH_SIZE,
                  seed: int = DEFAULT_SEED, progress: Progress = None,
                  device=None) -> OracleSample:
    """Exact ablation of `neurons` of the layer's neurons drawn at random (`draw_neurons`):
    a number m (all: n or more) on every sample; an `OraclePlan` (its neurons, on its share
    of each cluster of `clusters` [N], `draw_samples`); or None, the plan `budget` seconds
    allow (`plan_oracle`). Inputs in memory [N, ...]; targets as in `neuron_scores`.
    progress(fraction) after each batch."""
    options = dict(batch_size=batch_size, device=device)
    if neurons is None:
        neurons = plan_oracle(model, layer, inputs, targets, clusters, budget=budget,
                              seed=seed, **options)
    if isinstance(neurons, OraclePlan):  # the plan has read the layer's width already
        size, n_neurons, share = neurons.neurons, neurons.n_neurons, neurons.share
    else:
        size, n_neurons, share = int(neurons), layer_width(model, layer, inputs, device), 1.0
    chosen = draw_neurons(n_neurons, size, seed)
    samples = None
    if share < 1:
        samples = draw_samples(cluster_codes_of(clusters, n_rows(inputs)), share, seed)
        inputs = take(inputs, torch.from_numpy(samples))
        targets = None if targets is None else targets[samples]
    facts = ScoreFacts()
    effects = neuron_scores(model, layer, inputs, targets, "ablation", progress=progress,
                            neurons=None if len(chosen) == n_neurons else chosen,
                            facts=facts, **options).numpy()
    return OracleSample(chosen, n_neurons, effects, facts.layer, samples)


def neuron_draws(n_sampled: int, n_neurons: int, n_draws: int,
                 generator: np.random.Generator) -> Optional[np.ndarray]:
    """[n_draws, m]: the positions among the m sampled neurons that each resample takes,
    by Gross's bootstrap of a finite population: the m replicated to a population of n
    (each floor(n / m) times, the remainder drawn at random), m drawn from it without
    replacement. None when m = n (the neurons are the whole layer: nothing to resample)."""
    if n_sampled >= n_neurons:
        return None
    copies, remainder = divmod(n_neurons, n_sampled)
    base = np.tile(np.arange(n_sampled, dtype=np.int32), copies)
    extra = np.argsort(generator.random((n_draws, n_sampled)), axis=1)[:, :remainder]
    population = np.concatenate([np.broadcast_to(base, (n_draws, len(base))),
                                 extra.astype(np.int32)], axis=1)
    return generator.permuted(population, axis=1)[:, :n_sampled]


MEASURES = ("spearman", "kendall", "top_overlap")
CONVENTIONS = ("signed", "abs")
RANK_DRAWS = 200
"""Resamples of Kendall's tau and the top-k overlap (the first of the bootstrap's): each
costs O(m^2) or a sort per resample, where Spearman's is one product of ranks."""


def overlap_k(top_k: int, n_sampled: int, n_neurons: int) -> int:
    """The k of the top-k overlap on m of n neurons: the top k of n stand for the top
    round(k m / n) of m (halves up; at least 1, at most m); k itself when m = n."""
    return max(1, min(n_sampled, math.floor(top_k * n_sampled / n_neurons + 0.5)))


@dataclass(frozen=True)
class Measured:
    """One agreement measure: its `value` on the data and its bootstrap `draws`; `pivot`
    where the samples measured were a share of the cluster's (`ranks.pivot_interval`
    within `bounds`, else `ranks.interval`)."""

    value: float
    draws: np.ndarray
    pivot: bool = False
    bounds: tuple[float, float] = (-1.0, 1.0)

    def interval(self) -> tuple[float, float]:
        return interval_of(self.draws, self.value, self.pivot, self.bounds)


def interval_of(draws: np.ndarray, value: float, pivot: bool,
                bounds: tuple[float, float] = (-1.0, 1.0)) -> tuple[float, float]:
    """The interval of an agreement measure from its resamples: `ranks.pivot_interval`
    where the samples were a share of the cluster's (`pivot`), else `ranks.interval`."""
    return pivot_interval(draws, value, bounds) if pivot else interval(draws, value)


def sample_counts_of(measured: int, total: int, n_draws: int,
                  generator: np.random.Generator) -> np.ndarray:
    """[n_draws, s]: how often each of the s samples measured is drawn in each resample:
    `ranks.bootstrap_counts` where they are every sample of the cluster (s = total), else
    Gross's bootstrap of a finite population (the s replicated to the cluster's total, s
    drawn without replacement, `neuron_draws`), so the resamples vary as much as a sample
    of s of the total does."""
    picks = neuron_draws(measured, total, n_draws, generator)
    if picks is None:
        return bootstrap_counts(max(1, measured), n_draws, generator)
    counts = np.zeros((n_draws, measured))
    np.add.at(counts, (np.arange(n_draws)[:, None], picks), 1.0)
    return counts


class Resamples:
    """One cluster's resamples, shared by every ranking compared with its oracle (paired
    draws, and the oracle's side computed once).

    Args:
        effects: the oracle on the cluster's r samples and m sampled neurons [r, m].
        n_neurons: the layer's n (m = n: the neurons are not resampled).
        counts: [D, r] resamples of the samples (`sample_counts_of`).
        generator: draws the neurons' resamples (`neuron_draws`).
        pivot: the r samples are a share of the cluster's (`Measured.pivot`).
    """

    def __init__(self, effects: np.ndarray, n_neurons: int, counts: np.ndarray,
                 generator: np.random.Generator, pivot: bool = False):
        self.counts, self.n_neurons, self.pivot = counts, n_neurons, pivot
        self.n_sampled = effects.shape[1]
        self.picks = neuron_draws(self.n_sampled, n_neurons, len(counts), generator)
        effects = effects.astype(np.float64)
        self.oracle = effects.mean(0)  # [m]
        self.drawn_oracle = self.pick(counts @ effects / max(1, effects.shape[0]))  # [D, m]
        self._ranks: dict[str, np.ndarray] = {}

    def pick(self, drawn: np.ndarray) -> np.ndarray:
        """[D, m] values of each resample's neurons, from [D, m] values of the m."""
        return drawn if self.picks is None else np.take_along_axis(drawn, self.picks, 1)

    def oracle_values(self, convention: str) -> tuple[np.ndarray, np.ndarray]:
        """(the oracle [m], its resamples [D, m]) as `convention` compares them."""
        if convention == "signed":
            return self.oracle, self.drawn_oracle
        return np.abs(self.oracle), np.abs(self.drawn_oracle)

    def oracle_ranks(self, convention: str) -> np.ndarray:
        """`ranks.row_ranks` of the oracle's resamples, computed once per convention."""
        if convention not in self._ranks:
            self._ranks[convention] = row_ranks(self.oracle_values(convention)[1])
        return self._ranks[convention]


def agreement_draws(scores: np.ndarray, resamples: Resamples, reduce: str, *,
                    top_k: Optional[int] = None, conventions=CONVENTIONS,
                    measures=MEASURES, drawn=MEASURES) -> dict[tuple[str, str], Measured]:
    """A ranking's agreement with the oracle on m of a layer's n neurons, measured on the
    data and in each resample of both the samples and the neurons.

    Args:
        scores: one cluster's per-sample scores of the m sampled neurons [r, m].
        resamples: the cluster's `Resamples` (its oracle and draws).
        reduce: how `scores` become the ranking (`reduce_scores`); the oracle is their mean.
        top_k: the top-k overlap's k on n neurons (`overlap_k` on m); None: without it.
        conventions: "signed" (the values as they are) and/or "abs" (magnitudes).
        measures: of `MEASURES`; Kendall's and the overlap's draws are the first RANK_DRAWS.
        drawn: the measures resampled; the others' draws are empty (no interval).
    Returns:
        {(measure, convention): Measured}.
    """
    ranking = np.asarray(reduce_scores(scores.astype(np.float64), reduce))
    drawn_ranking = resamples.pick(resampled_ranking(scores, reduce, resamples.counts))
    k = (None if top_k is None else
         overlap_k(top_k, resamples.n_sampled, resamples.n_neurons))
    result = {}
    for convention in conventions:
        a, drawn_a = ((ranking, drawn_ranking) if convention == "signed"
                      else (np.abs(ranking), np.abs(drawn_ranking)))
        b, drawn_b = resamples.oracle_values(convention)
        few_a, few_b = drawn_a[:RANK_DRAWS], drawn_b[:RANK_DRAWS]
        for measure in measures:
            resampled = measure in drawn
            if measure == "spearman":
                value = rank_correlation("spearman", a, b)
                draws = (row_spearman(row_ranks(drawn_a), resamples.oracle_ranks(convention))
                         if resampled else None)
            elif measure == "kendall":
                value = rank_correlation("kendall", a, b)
                draws = row_kendall(few_a, few_b) if resampled else None
            elif k is not None:
                value = top_k_overlap(a, b, k)
                draws = row_top_overlap(few_a, few_b, k) if resampled else None
            else:
                continue
            result[measure, convention] = Measured(
                value, np.empty(0) if draws is None else draws, resamples.pivot,
                (0.0, 1.0) if measure == "top_overlap" else (-1.0, 1.0))
    return result


def resampled_ranking(scores: np.ndarray, reduce: str, counts: np.ndarray) -> np.ndarray:
    """[D, m]: the cluster scores by `reduce` of the per-sample `scores` [r, m] in each
    resample of the samples `counts` [D, r]; only the sums that `reduce` reads."""
    values = scores.astype(np.float64)
    size = torch.full((len(counts),), float(scores.shape[0]), dtype=torch.float64)
    unread = torch.empty(0, dtype=torch.float64)
    statistics = ClusterStatistics(
        pd.RangeIndex(len(counts)), size, torch.from_numpy(counts @ values),
        torch.from_numpy(counts @ np.abs(values)) if reduce == "mean_abs" else unread,
        torch.from_numpy(counts @ (values * values)) if reduce == "std" else unread)
    return reduce_scores(statistics, reduce).numpy()


@dataclass(frozen=True)
class Agreement:
    """A ranking's agreement with a (sampled) oracle: `value`, its interval (`low`, `high`)
    at CONFIDENCE over the samples and the neurons drawn, the m of n neurons it rests on,
    and the samples it measured of the cluster's."""

    value: float
    low: float
    high: float
    n_sampled: int
    n_neurons: int
    samples: int = 0
    n_samples: int = 0

    def words(self, symbol: str = "ρ") -> str:
        """"on 256 of 3,072 neurons: ρ = 0.71 [0.64, 0.77]" (the neurons said when sampled;
        "on 32 of 3,072 neurons and 40 of 256 samples: ..." when the samples were too)."""
        said = f"{symbol} = {self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"
        where = []
        if self.n_sampled < self.n_neurons:
            where.append(f"{self.n_sampled:,} of {self.n_neurons:,} neurons")
        if self.samples < self.n_samples:
            where.append(f"{self.samples:,} of {self.n_samples:,} samples")
        return f"on {' and '.join(where)}: {said}" if where else said


def sampled_spearman(scores: np.ndarray, oracle: OracleSample, reduce: str,
                     sample_counts: np.ndarray, generator: np.random.Generator) -> Agreement:
    """Spearman of a cluster's ranking with the oracle on its sampled neurons (and samples),
    signed for reduce="mean", else of magnitudes, with its bias-corrected interval
    (`ranks.interval`) over the samples and the neurons drawn (`agreement_draws`).

    Args:
        scores: the cluster's per-sample scores [r, n] (every neuron of the layer).
        oracle: the cluster's oracle sample (effects [r, m], or [s, m] on `samples`).
        reduce: how the scores become the ranking.
        sample_counts: [D, r] resamples of the cluster's samples; where the oracle
            measured s of them, D resamples of those s are drawn by `generator` instead
            (`sample_counts_of`), and the interval is `ranks.pivot_interval`.
        generator: draws the neurons' resamples.
    """
    convention = "signed" if reduce == "mean" else "abs"
    measured_scores = oracle.of(scores)
    pivot = oracle.samples is not None
    if pivot:
        sample_counts = sample_counts_of(len(oracle.samples), len(scores), len(sample_counts),
                                         generator)
    resamples = Resamples(oracle.effects, oracle.n_neurons, sample_counts, generator, pivot)
    measured = agreement_draws(measured_scores[:, oracle.neurons], resamples, reduce,
                               conventions=(convention,), measures=("spearman",))
    found = measured["spearman", convention]
    return Agreement(found.value, *found.interval(), len(oracle.neurons), oracle.n_neurons,
                     len(measured_scores), len(scores))

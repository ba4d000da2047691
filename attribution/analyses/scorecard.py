"""Which method to trust, on every layer: each method's agreement with exact ablation.

Molchanov et al. (ICLR 2017, 2019) judged importance criteria by their rank correlation with
the oracle, the drop of the target logit when one neuron alone is removed. `scorecard` does
that for every (layer, method), per cluster, with the uncertainty of a bootstrap over samples,
the damage its ranking does on a pruning curve, and a sanity check: Adebayo et al.'s (2018)
cascading randomisation, re-initialising everything after the layer. Per cluster c of m
samples, with S [m, n] a method's per-sample scores and A [m, n] exact ablation's (both for
the true label, or the predicted class without labels):

- spearman, kendall: rank correlation of the signed means S.mean(0) and A.mean(0), averaged
  over clusters (NaN where a ranking is constant);
- spearman_low, spearman_high: the 2.5% and 97.5% percentiles of that average over bootstrap
  draws, each resampling the samples within every cluster (the same draws for S and A, and
  for every method of a layer);
- top_overlap: |top-k of S.mean(0) ∩ top-k of A.mean(0)| / k, k = max(1, round(n / 10))
  (halves rounded up), averaged over clusters;
- curve_area: (A_random - A_method) / (A_random - A_ablation), where A_x is the area under
  the cluster's metric-vs-k curve when the top-k neurons of ranking x are removed (A_random:
  the mean over random orders), averaged over clusters: `random` is 0 by construction (its
  area is the random orders' mean), the oracle's own ranking 1, a ranking that does more
  damage than the oracle's above 1. A cluster where the oracle's area is within the random
  orders' spread (their standard deviation) of A_random has no scale to divide by: NaN;
- after_randomization: Spearman of S.mean(0) with the same method's cluster scores on a copy
  of the model whose modules after the layer are re-initialised (`randomized_after`),
  averaged over clusters. A ranking that survives it (near 1) does not read the model after
  the layer: `activation` scores 1 by construction; NaN where nothing follows the layer.

Exact ablation is computed once per layer and serves every row of it.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..engine import model_io
from ..engine.guards import eval_mode, forward_hooks
from ..engine.layers import list_layers, resolve_layer, run_model
from ..errors import AttributionError
from ..methods.passes import check_targets
from ..methods.scores import Inputs, check_method, cluster_codes, neuron_scores
from .oracle_sample import (MEASURES, OraclePlan, OracleSample, Resamples, agreement_draws,
                            draw_neurons, interval_of, plan_oracle, sample_counts_of,
                            sample_oracle)
from .ranks import bootstrap_counts, row_ranks, row_spearman
from .path_steps import StepsChoice, takes_steps
from .costs import (SampledCost, cluster_codes_of, part_sizes, probe_sizes, sampled_cost,
                    stratified, take_rows)
from .prune import copy_model
from .pruning_curves import model_default_metric, order_curves, random_orders, spaced_ks
from .view import View
from .settings import (DEFAULT_ABLATION, DEFAULT_BATCH_SIZE, DEFAULT_N_STEPS,
                       DEFAULT_SEED, BOOTSTRAP_DRAWS, SCORECARD_CURVE_POINTS,
                       SCORECARD_METHODS, SCORECARD_N_RANDOM)

SCORECARD_COLUMNS = ("layer", "method", "spearman", "kendall", "spearman_low", "spearman_high",
                     "top_overlap", "curve_area", "after_randomization", "n_clusters",
                     "kendall_low", "kendall_high", "top_overlap_low", "top_overlap_high",
                     "neurons", "n_neurons", "samples", "n_samples", "n_steps")
ORACLE = "ablation"
BASELINE = "random"
"""The method whose ranking is a random order: its curve_area is the random orders' own
mean area, so it is 0 by construction (one draw's area scatters around it)."""
_NOISE = 1e-6  # areas closer than this (relative) are equal to float precision

TableProgress = Optional[Callable[[float, pd.DataFrame], object]]


def scorecard(model: nn.Module, inputs: Inputs, targets=None, clusters=None, *,
              batch_size: int = DEFAULT_BATCH_SIZE, n_steps: StepsChoice = DEFAULT_N_STEPS,
              seed: int = DEFAULT_SEED, device=None, **card) -> pd.DataFrame:
    """Every method's agreement with exact ablation on every layer: `scorecard_on` the view
    of these arguments.

    Args:
        model: classifier returning logits [N, n_classes]; left exactly as it was found.
        inputs: [N, ...] tensor or array, or named inputs, held in memory.
        targets: the true class of each sample, LongTensor [N]; None = the predicted class.
        clusters: one cluster id per sample [N]; None = all samples form one cluster.
        batch_size, seed, device: as in `neuron_scores` (seed also draws the neurons, the
            bootstrap, the random orders and the re-initialisation).
        n_steps: a path method's steps on every layer, or {"layer/method": steps or its
            `path_steps.StepsPlan`} (`plan_layer_steps`: as many as fit a budget on each
            layer; DEFAULT_N_STEPS where a key is missing).
        card: `scorecard_on`'s options (layers=, methods=, n_boot=, ..., resume=).
    """
    view = View.of(model, None, inputs, targets, clusters, batch_size=batch_size, seed=seed,
                   n_steps=n_steps, device=device)
    return scorecard_on(view, **card)


def scorecard_on(view: View, *, layers: Optional[Sequence[str]] = None,
                 methods: Sequence[str] = SCORECARD_METHODS,
                 n_boot: int = BOOTSTRAP_DRAWS, n_random: int = SCORECARD_N_RANDOM,
                 curve_points: int = SCORECARD_CURVE_POINTS, metric: Optional[str] = None,
                 curve_targets="targets", ablation: str = DEFAULT_ABLATION,
                 oracle_neurons: Union[int, Mapping[str, Union[int, OraclePlan,
                                                                OracleSample]], None] = None,
                 progress: TableProgress = None,
                 resume: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Every method's agreement with exact ablation on every layer of the view's model (see
    the module's table), on the view's inputs (held in memory), targets (the true class of
    each sample, LongTensor [N]; None = the predicted class) and clusters (None: one
    cluster), with its batch size, path steps ({"layer/method": steps or its
    `path_steps.StepsPlan`} from `plan_layer_steps`, or one number), seed (it also draws the
    neurons, the bootstrap, the random orders and the re-initialisation) and device; the
    view's layer is not read.

    Args:
        layers: layer names (or "name:axis" specs); None = every layer of `list_layers`.
        methods: scoring methods; a method that refuses a layer (weight_norm on a ReLU,
            conductance on token ids) leaves that row out, its reason in attrs["refused"].
        n_boot: bootstrap draws of the spearman interval.
        n_random, curve_points: random orders of curve_area and its k values (curve_points
            + 1 evenly spaced values of k, 0 and n included).
        metric, ablation: what the curves measure (None: accuracy, or for a regression head
            its squared error against real-valued targets, else its output) and what a
            removed neuron's output becomes, as in `pruning_curve` ("mean": the mean over
            the cluster's samples).
        curve_targets: what the curves measure against: "targets" (the classes scored), a
            LongTensor [N], a regression head's true values [N], or None (the predicted
            class); see `settings.curve_targets`.
        oracle_neurons: how many neurons of each layer to ablate exactly, drawn at random,
            on every sample (all: the layer's n or more), or {layer: how many, its
            `oracle_sample.OraclePlan` (`scorecard_oracle_plans`), or its oracle already
            measured on these inputs (`sample_oracle`'s `OracleSample`)}; None = on each layer
            `oracle_sample.plan_oracle`'s, as fit `oracle_sample.ORACLE_SECONDS`. On m of n
            neurons every column is measured on those m (`oracle_sample`: the curves
            remove them only), its intervals over the samples and the neurons drawn; where
            the plan measures a share of each cluster's samples, the layer's every column
            is measured on those samples.
        progress: called as progress(fraction, partial_table) after each method's scores
            (on the model, then on its randomised copy with the method's row); may raise.
            The partial table's attrs: "layers_done" (the layers whose every row is in it),
            "refused", "reinitialised" and "ks" so far.
        resume: a partial table that `progress` received from an interrupted call with the
            same arguments: its layers done are taken as they are, not measured again
            (the rest is measured as the uninterrupted call would, with the same draws).
    Returns:
        DataFrame with columns `SCORECARD_COLUMNS`, one row per (layer, method), layers in
        call order and methods in the order given; neurons: the m of the layer's n_neurons
        measured; samples: the samples measured of the n_samples; n_steps: a path method's
        steps on that layer (<NA> for the others). attrs: "refused"
        {"layer/method": reason}, "reinitialised" {layer: the modules re-initialised after
        it}, n_boot, n_random, metric, ablation, ks {layer: the k values of its curves}.
    """
    model, inputs, targets, clusters = view.model, view.inputs, view.targets, view.clusters
    batch_size, seed, device = view.settings.batch_size, view.settings.seed, view.device
    methods = list(dict.fromkeys(methods))
    for method in methods:
        check_method(method)
    if n_boot < 1 or n_random < 1 or curve_points < 1:
        raise AttributionError("n_boot, n_random and curve_points must be positive integers.")
    x = model_io.named(inputs)
    x = torch.as_tensor(x) if isinstance(x, np.ndarray) else x
    if not model_io.is_batch(x):
        raise AttributionError("scorecard needs the inputs in memory (a tensor, an array or "
                               "named inputs), not an iterable of batches.")
    total = model_io.n_rows(x)
    if targets is not None:
        targets = check_targets(torch.as_tensor(targets), total)
    if isinstance(curve_targets, str) and curve_targets == "targets":
        curve_targets = targets
    elif curve_targets is not None:
        curve_targets = torch.as_tensor(curve_targets)
    codes, ids = cluster_codes(np.zeros(total, dtype=np.int64) if clusters is None
                               else clusters, total)
    rows_of = [np.flatnonzero(codes == code) for code in range(len(ids))]
    if layers is None:
        layers = [info.spec for info in list_layers(model, model_io.take(x, slice(0, 2)))]
    options = dict(batch_size=batch_size, seed=seed, device=device)
    metric = model_default_metric(model, x, curve_targets, metric)  # said in the attrs
    curve_options = dict(ablation=ablation, metric=metric, batch_size=batch_size,
                         device=device)
    table, attrs = _resumed(resume, layers)
    refused, reinitialised, ks_of = attrs["refused"], attrs["reinitialised"], attrs["ks"]
    draws = _bootstrap_draws(rows_of, n_boot, seed)
    steps, done = 2 * len(methods) * len(layers), 2 * len(methods) * len(attrs["layers_done"])

    def step() -> None:  # one method scored, on the model or on its randomised copy
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / steps, _partial(table, attrs))

    every_sample = (x, targets, curve_targets, clusters, rows_of, draws)
    for position, layer in enumerate(layers):
        if layer in attrs["layers_done"]:
            continue
        x, targets, curve_targets, clusters, rows_of, draws = every_sample
        resolve_layer(model, layer)
        chosen = oracle_neurons.get(layer) if isinstance(oracle_neurons, Mapping) \
            else oracle_neurons
        oracle = _checked(chosen, layer, total) if isinstance(chosen, OracleSample) else \
            sample_oracle(model, layer, x, targets, chosen, codes, batch_size=batch_size,
                          seed=seed, device=device)
        if oracle.samples is not None:  # the layer measured on the oracle's samples alone
            x, targets, curve_targets, clusters = (
                take_rows(value, oracle.samples)
                for value in (x, targets, curve_targets, clusters))
            rows_of = [np.flatnonzero(codes[oracle.samples] == code)
                       for code in range(len(ids))]
            draws = _bootstrap_draws(rows_of, n_boot, seed,
                                     [len(rows) for rows in every_sample[4]])
        subset = None if oracle.exact else oracle.neurons
        ks_of[layer] = spaced_ks(len(oracle.neurons), curve_points)
        oracle_means = _cluster_means(oracle.effects, rows_of)
        generator = np.random.default_rng([seed, position])  # the same for every method
        resamples = [Resamples(oracle.effects[rows], oracle.n_neurons, counts, generator,
                               pivot=oracle.samples is not None)
                     for counts, rows in zip(draws, rows_of)]
        scored: dict[str, np.ndarray] = {}
        steps_of = {method: view.steps(f"{layer}/{method}") for method in methods}
        for method in methods:
            try:
                scored[method] = oracle.effects if method == ORACLE else neuron_scores(
                    model, layer, x, targets, method, clusters=clusters, neurons=subset,
                    n_steps=steps_of[method], **options).numpy()
            except AttributionError as error:
                refused[f"{layer}/{method}"] = str(error)
                step()  # no second pass either
            step()
        randomized, reinitialised[layer] = randomized_after(
            model, layer, model_io.take(x, slice(0, 2)), seed)
        means = {method: _cluster_means(scores, rows_of) for method, scores in scored.items()}
        areas = _curve_areas(model, layer, x, curve_targets, rows_of, means, oracle_means,
                             oracle, ks_of[layer], n_random, seed, curve_options)
        for method, scores in scored.items():
            after = (np.nan if not reinitialised[layer] else _mean_correlation(
                means[method], _cluster_means(neuron_scores(
                    randomized, layer, x, targets, method, clusters=clusters,
                    neurons=subset, n_steps=steps_of[method], **options).numpy(), rows_of)))
            table.append({"layer": layer, "method": method,
                          **_agreement(scores, rows_of, resamples, top_k_of(oracle.n_neurons)),
                          "curve_area": _nanmean(areas[method]),
                          "after_randomization": after, "n_clusters": len(rows_of),
                          "neurons": len(oracle.neurons), "n_neurons": oracle.n_neurons,
                          "samples": model_io.n_rows(x), "n_samples": total,
                          "n_steps": steps_of[method] if takes_steps(method) else pd.NA})
            if method == list(scored)[-1]:
                attrs["layers_done"].append(layer)
            step()
        if not scored:
            attrs["layers_done"].append(layer)
    if not table:
        raise AttributionError("No method could score these layers: "
                               + "; ".join(f"{key}: {reason}" for key, reason in refused.items()))
    frame = _frame(table)
    frame.attrs.update(refused=refused, reinitialised=reinitialised, n_boot=n_boot,
                       n_random=n_random, metric=metric, ablation=ablation, ks=ks_of)
    return frame


def _checked(oracle: OracleSample, layer: str, total: int) -> OracleSample:
    """`oracle`, given for `layer`, where it fits `total` samples: effects [N, m] (or
    [s, m] with its `samples` among the N) of m of its n neurons."""
    rows = total if oracle.samples is None else len(oracle.samples)
    fits = (oracle.effects.ndim == 2 and oracle.effects.shape == (rows, len(oracle.neurons))
            and (oracle.samples is None or (len(oracle.samples) and
                                             0 <= oracle.samples.min() and
                                             oracle.samples.max() < total))
            and len(oracle.neurons) and 0 <= oracle.neurons.min()
            and oracle.neurons.max() < oracle.n_neurons)
    if not fits:
        raise AttributionError(f"The oracle given for {layer} does not fit these {total} "
                               "samples: measure it on them (sample_oracle).")
    return oracle


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(SCORECARD_COLUMNS))
    return frame.astype({"n_steps": "Int64"})


def _partial(rows: list[dict], attrs: dict) -> pd.DataFrame:
    """The table so far, with what a resumed call takes from it in its attrs."""
    frame = _frame(rows)
    frame.attrs.update({key: (list(value) if isinstance(value, list) else dict(value))
                        for key, value in attrs.items()})
    return frame


def _resumed(partial: Optional[pd.DataFrame], layers: Sequence[str]) -> tuple[list[dict], dict]:
    """The rows and attrs ("layers_done", "refused", "reinitialised", "ks") of the layers
    `partial` (a `progress` table) finished; nothing where it is None."""
    if partial is None:
        return [], {"layers_done": [], "refused": {}, "reinitialised": {}, "ks": {}}
    done = partial.attrs.get("layers_done")
    if not isinstance(done, list) or not set(done) <= set(layers) or \
            list(partial.columns) != list(SCORECARD_COLUMNS):
        raise AttributionError("resume= is not a partial scorecard of these layers (the "
                               "table progress received); measure from the start "
                               "(resume=None).")
    refused = partial.attrs.get("refused", {})  # "layer/method" -> reason
    return (partial[partial["layer"].isin(done)].to_dict("records"),
            {"layers_done": list(done),
             "refused": {key: reason for key, reason in refused.items()
                         if key.rsplit("/", 1)[0] in done},
             "reinitialised": {k: v for k, v in partial.attrs.get("reinitialised", {}).items()
                               if k in done},
             "ks": {k: v for k, v in partial.attrs.get("ks", {}).items() if k in done}})


def top_k_of(n_neurons: int) -> int:
    """The k of top_overlap: max(1, round(n / 10)), halves rounded up."""
    return max(1, math.floor(n_neurons / 10 + 0.5))


# ------------------------------------------------------------------------- agreement

def _cluster_means(scores: np.ndarray, rows_of: list[np.ndarray]) -> np.ndarray:
    """[C, n]: each cluster's signed mean of per-sample scores [N, n]."""
    return np.stack([scores[rows].astype(np.float64).mean(0) for rows in rows_of])


def _bootstrap_draws(rows_of: list[np.ndarray], n_boot: int, seed: int,
                     totals: Optional[list[int]] = None) -> list[np.ndarray]:
    """Per cluster, resamples of its samples [n_boot, m] (one generator, seeded):
    `bootstrap_counts`, or where they are a share of the cluster's `totals`,
    `oracle_sample.sample_counts_of`."""
    generator = np.random.default_rng(seed)
    if totals is None:
        return [bootstrap_counts(len(rows), n_boot, generator) for rows in rows_of]
    return [sample_counts_of(len(rows), total, n_boot, generator)
            for rows, total in zip(rows_of, totals)]


def _agreement(scores: np.ndarray, rows_of: list[np.ndarray], resamples: list[Resamples],
               top_k: int) -> dict[str, float]:
    """spearman, kendall and top_overlap of one method's per-sample scores [N, m] (of the
    m neurons the oracle measured) with the oracle, each averaged over clusters, with its
    interval: the average in each resample (`oracle_sample.agreement_draws`, the same
    resamples for every method)."""
    measured = [agreement_draws(scores[rows], resampled, "mean", top_k=top_k,
                                conventions=("signed",))
                for rows, resampled in zip(rows_of, resamples)]
    result: dict[str, float] = {}
    for measure in MEASURES:
        values = [found[measure, "signed"] for found in measured]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # every cluster NaN in a draw
            per_draw = np.nanmean(np.stack([found.draws for found in values]), axis=0)
        value = _nanmean([found.value for found in values])
        result[measure] = value
        result[f"{measure}_low"], result[f"{measure}_high"] = interval_of(
            per_draw, value, values[0].pivot, values[0].bounds)
    return result


def _nanmean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    return float(values[np.isfinite(values)].mean()) if np.isfinite(values).any() else np.nan


def _mean_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman of each row of a [C, n] with b's, averaged over rows."""
    return _nanmean(row_spearman(row_ranks(a), row_ranks(b)))


# ------------------------------------------------------------------------ curve area

def _curve_areas(model, layer, x, targets, rows_of, means: dict[str, np.ndarray],
                 oracle_means: np.ndarray, oracle: OracleSample, ks: list[int],
                 n_random: int, seed: int, curve_options: dict) -> dict[str, list[float]]:
    """Per method, each cluster's (A_random - A_method) / (A_random - A_ablation), with every
    ranking and the random orders measured in one pass over the cluster's samples. Means
    [C, m] rank the oracle's m neurons, which alone are removed (k <= m): on a sample of
    the layer's neurons, the curves of that sample."""
    sampled = torch.as_tensor(oracle.neurons)
    rest = torch.as_tensor(np.setdiff1d(np.arange(oracle.n_neurons), oracle.neurons))

    def layer_orders(positions: torch.Tensor) -> torch.Tensor:
        """[O, n] orders of the layer's neurons: the sampled ones in `positions` [O, m]
        order, then the others (never removed)."""
        return torch.cat([sampled[positions], rest.expand(len(positions), -1)], dim=1)

    randoms = layer_orders(random_orders(len(sampled), n_random, seed))
    names = list(means)
    areas: dict[str, list[float]] = {name: [] for name in names}
    for cluster, rows in enumerate(rows_of):
        rankings = [means[name][cluster] for name in names] + [oracle_means[cluster]]
        orders = torch.cat([layer_orders(torch.as_tensor(np.stack(
            [np.argsort(-values, kind="stable") for values in rankings]))), randoms])
        part = torch.from_numpy(rows)
        metric = order_curves(model, layer, model_io.take(x, part),
                              targets[part] if targets is not None else None, orders, ks,
                              **curve_options)  # [O, K]
        area = (np.trapezoid(metric, ks, axis=1) / (ks[-1] - ks[0]) if len(ks) > 1
                else metric[:, 0])
        random_areas, oracle_area = area[len(names) + 1:], area[len(names)]
        random_area = random_areas.mean()
        span = random_area - oracle_area
        spread = random_areas.std(ddof=1) if len(random_areas) > 1 else 0.0
        for position, name in enumerate(names):
            if abs(span) <= max(spread, _NOISE * max(abs(random_area), 1.0)):
                areas[name].append(np.nan)  # the oracle does no more damage than random
            else:
                mine = random_area if name == BASELINE else area[position]
                areas[name].append((random_area - mine) / span)
    return areas


# ------------------------------------------------------------ cascading randomisation

def scorecard_oracle_plans(model: nn.Module, inputs: Inputs, targets=None, clusters=None, *,
                           layers: Optional[Sequence[str]] = None,
                           batch_size: int = DEFAULT_BATCH_SIZE, seed: int = DEFAULT_SEED,
                           device=None) -> dict[str, OraclePlan]:
    """{layer: the oracle `scorecard(..., oracle_neurons=None)` runs on it}:
    `scorecard_oracle_plans_on` the view of these arguments."""
    view = View.of(model, None, inputs, targets, clusters, batch_size=batch_size, seed=seed,
                   device=device)
    return scorecard_oracle_plans_on(view, layers)


def scorecard_oracle_plans_on(view: View, layers: Optional[Sequence[str]] = None
                              ) -> dict[str, OraclePlan]:
    """{layer: the oracle `scorecard_on(view, layers=layers)` runs on it}: as many neurons
    (and, where even the fewest pass the budget, as large a share of each cluster's
    samples) as fit `oracle_sample.ORACLE_SECONDS`, timed now (`plan_oracle`). A front end
    passes the plans to `scorecard_cost_on` and `scorecard_on` alike. In-memory inputs
    only."""
    x = model_io.named(view.inputs)
    x = torch.as_tensor(x) if isinstance(x, np.ndarray) else x
    if layers is None:
        layers = [info.spec for info in list_layers(view.model, model_io.take(x, slice(0, 2)))]
    targets = None if view.targets is None else torch.as_tensor(view.targets)
    return {layer: plan_oracle(view.model, layer, x, targets, view.clusters,
                               batch_size=view.settings.batch_size, seed=view.settings.seed,
                               device=view.device) for layer in layers}


def scorecard_cost(model: nn.Module, inputs: Inputs, targets=None, clusters=None, *,
                   batch_size: int = DEFAULT_BATCH_SIZE, n_steps: StepsChoice = DEFAULT_N_STEPS,
                   seed: int = DEFAULT_SEED, device=None, **card) -> SampledCost:
    """The seconds `scorecard(model, inputs, targets, clusters, ...)` will take, said before
    it runs: `scorecard_cost_on` the view of these arguments."""
    view = View.of(model, None, inputs, targets, clusters, batch_size=batch_size, seed=seed,
                   n_steps=n_steps, device=device)
    return scorecard_cost_on(view, **card)


def scorecard_cost_on(view: View, **card) -> SampledCost:
    """The seconds `scorecard_on(view, **card)` will take, said before it runs. The
    oracle's sizes are chosen first, on all the samples (`scorecard_oracle_plans_on`), and
    kept: the timing and the run ablate the same neurons.
    Where every layer's oracle is exact (every neuron on every sample) and the data is more
    than one timing's sample, the scorecard itself is timed on samples that keep every
    cluster (`costs.sampled_cost`) and extrapolated: every part grows with the samples.
    Where a plan sized its oracle to the budget (a sample of the neurons, or of the samples:
    its plan has timed it already, and timing it again would cost a share of the budget),
    or one sample would be all the data (the estimate would cost the work), each layer's
    exact ablation, and the `ablation` method's scores on its randomised copy (the same
    neurons and samples), are taken at the plan's seconds. Only the rest is timed, on an
    eighth and a quarter of the samples where they are under two batches
    (`costs.part_sizes`): the other methods'
    scores on the model and its copy, the bootstrap and the curves, with stand-in effects
    in the oracle's place on as large a share of the samples as it measures. Per-sample
    `curve_targets` are sampled too. In-memory inputs only."""
    inputs, clusters = view.inputs, view.clusters
    batch_size, seed = view.settings.batch_size, view.settings.seed
    if card.get("oracle_neurons") is None:
        card = dict(card, oracle_neurons=scorecard_oracle_plans_on(view, card.get("layers")))
    chosen = dict(card, progress=None)
    plans = chosen["oracle_neurons"]
    total = model_io.n_rows(model_io.named(inputs))
    planned = isinstance(plans, Mapping) and plans and all(
        isinstance(plan, OraclePlan) for plan in plans.values())
    sized = planned and any(not plan.exact for plan in plans.values())
    one_timing = probe_sizes(total, batch_size)[0] >= total
    codes = cluster_codes_of(clusters, total)

    def run(sample, **changed) -> None:
        options = dict(chosen, **changed)
        if "curve_targets" in options:
            options["curve_targets"] = sample(options["curve_targets"])
        scorecard_on(replace(view, inputs=sample(inputs), targets=sample(view.targets),
                             clusters=sample(clusters)), **options)

    if not planned or (not sized and not one_timing):
        return sampled_cost("scorecard", run, inputs, clusters, batch_size)
    methods = list(dict.fromkeys(chosen.get("methods", SCORECARD_METHODS)))
    rest_methods = [method for method in methods if method != ORACLE] or [BASELINE]

    def rest(sample) -> None:  # the scorecard on `sample`, stand-ins in the oracle's place
        run(sample, methods=rest_methods,
            oracle_neurons={layer: _stand_in(plan, sample(codes), seed)
                            for layer, plan in plans.items()})

    timed = sampled_cost("the rest of the scorecard", rest, inputs, clusters, batch_size,
                         sizes=part_sizes(total, batch_size))
    copies = 2 if ORACLE in methods else 1
    return timed.with_planned(*((f"exact ablation of {layer}" + " (twice: the model and its "
                                 "randomised copy)" * (copies > 1), copies * plan.seconds)
                                for layer, plan in plans.items()))


def _stand_in(plan: OraclePlan, codes: np.ndarray, seed: int) -> OracleSample:
    """An oracle of `plan`'s size on samples of cluster `codes` [N] (its share of them,
    every cluster kept) whose effects are drawn, not measured: what the scorecard does
    after exact ablation costs the same on it."""
    samples = None if plan.share >= 1 else stratified(
        codes, max(1, round(len(codes) * plan.samples / max(plan.n_samples, 1))))
    neurons = draw_neurons(plan.n_neurons, plan.neurons, seed)
    rows = len(codes) if samples is None else len(samples)
    effects = np.random.default_rng(seed).standard_normal((rows, len(neurons)))
    return OracleSample(neurons, plan.n_neurons, effects.astype(np.float32), {}, samples)


def randomized_after(model: nn.Module, layer, example_input, seed: int = DEFAULT_SEED
                     ) -> tuple[nn.Module, list[str]]:
    """A copy of `model` whose modules that first run after `layer` are re-initialised
    (Adebayo et al. 2018's cascading randomisation, all at once): their own
    `reset_parameters` where they have one, else their own parameters' entries shuffled
    (same values, random places). Modules that also run before the layer (shared) and
    parameters used outside any module are left as they are, so the layer's output is
    unchanged.

    Args:
        example_input: a small batch [B, ...] that runs the model (call order is read from it).
    Returns:
        (the copy in eval mode, names of the modules re-initialised, in call order).
    """
    name = resolve_layer(model, layer)[0].split(":")[0]
    first_call: dict[str, int] = {}

    def record(module_name: str):
        def hook(module, args):
            first_call.setdefault(module_name, len(first_call))
        return hook

    modules = dict(model.named_modules())
    with eval_mode(model), torch.no_grad(), forward_hooks(
            {}, {module: record(module_name) for module_name, module in modules.items()
                 if module_name}):
        run_model(model, example_input)
    start = first_call.get(name)
    if start is None:
        raise AttributionError(f"Layer {name!r} did not run on the example input.")
    after = [module_name for module_name, order in sorted(first_call.items(),
                                                          key=lambda item: item[1])
             if order > start and not name.startswith(module_name + ".")]
    copied = copy_model(model).eval()
    changed = []
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.no_grad():
        torch.manual_seed(seed)
        for module_name in after:
            module = copied.get_submodule(module_name)
            own = list(module.parameters(recurse=False))
            if callable(getattr(module, "reset_parameters", None)) and own:
                module.reset_parameters()
            elif any(parameter.numel() > 1 for parameter in own):
                for parameter in own:
                    flat = parameter.detach().reshape(-1)
                    order = torch.randperm(flat.numel(), generator=generator)
                    parameter.copy_(flat[order.to(flat.device)].reshape(parameter.shape))
            else:
                continue
            changed.append(module_name)
    return copied, changed

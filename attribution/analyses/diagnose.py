"""The degeneracy check: do a layer's neuron scores carry information, and is one's own
gradient code right?

`diagnose` (`diagnose_on` a view) measures a layer's scores, gradients, activations, logits
and exact ablation on each cluster of the analysed samples and returns one `Finding` per
check (`attribution.analyses.findings`: what each check measures, and its thresholds);
`diagnose_plan` sizes its exact parts before it runs, and `diagnose_cost` says its seconds.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn

from ..engine import model_io
from ..errors import AttributionError
from ..engine.layers import resolve_layer, run_logits
from .ranks import bootstrap_counts
from .oracle_sample import (OraclePlan, OracleSample, oracle_timing, plan_of_timing,
                            sample_oracle)
from ..methods.passes import LayerPass, check_targets
from ..methods.paths import PathSums, sum_check
from ..methods.registry import REGISTRY
from .settings import (BOOTSTRAP_DRAWS, DEFAULT_ABLATION, DEFAULT_BATCH_SIZE, DEFAULT_METHOD,
                       DEFAULT_N_RANDOM, DEFAULT_N_STEPS, DEFAULT_REDUCE, DEFAULT_SEED,
                       EVIDENCE_CURVE_POINTS, EVIDENCE_METRIC)
from .costs import CurvePlan, SampledCost, part_sizes, plan_curve, probe_sizes, sampled_cost
from .view import View
from . import findings as check
from .findings import Finding, integral_finding
from ..methods.scores import (Inputs, ScoreFacts, check_method, cluster_codes, find_cluster,
                              neuron_scores, reduce_scores, score_batches)

FindingsProgress = Optional[Callable[[float, list], object]]
"""`diagnose`'s progress: (fraction done, the findings so far)."""


@dataclass(frozen=True)
class DiagnosePlan:
    """The exact, expensive parts of `diagnose` sized before it runs (`diagnose_plan`):
    `oracle`, the exact ablation disagrees_with_ablation reads (unused for the method
    "ablation", whose scores are the oracle on every neuron), and `curve`, the evidence
    curve of not_better_than_random. The estimate and the work read the same plan."""

    oracle: OraclePlan
    curve: CurvePlan

    def with_oracle_neurons(self, neurons: Optional[int] = None) -> "DiagnosePlan":
        """This plan with the oracle ablating `neurons` (None: every one) on every sample
        (`OraclePlan.exactly`): a user's choice where the budget drew fewer."""
        return replace(self, oracle=self.oracle.exactly(neurons))


def diagnose(model: nn.Module, layer, inputs: Inputs, targets=None, method: str = DEFAULT_METHOD,
             clusters=None, *, cluster=None, reduce: str = DEFAULT_REDUCE, user_scores=None,
             metric: str = EVIDENCE_METRIC, ablation: str = DEFAULT_ABLATION,
             n_random: int = DEFAULT_N_RANDOM, seed: int = DEFAULT_SEED,
             batch_size: int = DEFAULT_BATCH_SIZE, n_steps: int = DEFAULT_N_STEPS,
             oracle_neurons: Optional[int] = None, plan: Optional[DiagnosePlan] = None,
             progress: FindingsProgress = None, device=None) -> list[Finding]:
    """Check whether `method`'s cluster scores on `layer` are degenerate, and why:
    `diagnose_on` the view of these arguments.

    Args:
        model: classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name or the module itself.
        inputs: [N, ...] tensor or array, or an iterable of batches (held in memory here).
        targets: LongTensor [N], None (the predicted class) or "labels" (y of (x, y) batches).
        method: the scoring method under test (one of `method_names()`).
        clusters: 1-D array of cluster ids [N]; None = all samples form one cluster. A
            method fitted to the clusters (`probe`) needs them, and is fitted on all samples.
        cluster: check only this cluster; None = check every cluster, report the worst.
        reduce: how per-sample scores become the cluster score ("mean", "mean_abs", "std").
        n_random, seed: random orders of the evidence curve, and the seed of every draw.
        batch_size, n_steps, device: as in `neuron_scores`.
        user_scores, metric, ablation, oracle_neurons, plan, progress: as in `diagnose_on`.
    """
    view = View.of(model, layer, inputs, targets, clusters, method=method, cluster=cluster,
                   reduce=reduce, n_random=n_random, seed=seed, batch_size=batch_size,
                   n_steps=n_steps, device=device)
    return diagnose_on(view, user_scores=user_scores, metric=metric, ablation=ablation,
                       oracle_neurons=oracle_neurons, plan=plan, progress=progress)


def for_checks(view: View) -> View:
    """`view` with the checks' own DEFAULT_N_RANDOM random orders for the evidence curve:
    a front end's band of random orders (the Pruning page's `settings.n_random`) is a
    drawing choice, and fewer orders would coarsen the check's p-value."""
    return view.with_settings(n_random=DEFAULT_N_RANDOM)


def diagnose_on(view: View, *, user_scores=None, metric: str = EVIDENCE_METRIC,
                ablation: str = DEFAULT_ABLATION, oracle_neurons: Optional[int] = None,
                plan: Optional[DiagnosePlan] = None,
                progress: FindingsProgress = None) -> list[Finding]:
    """Check whether the view's method's cluster scores on its layer are degenerate, and
    why: on the view's cluster (`settings.cluster`), or on every cluster, reporting the
    worst.

    Args:
        view: the model, inputs (held in memory here; batches are read into it), targets
            (LongTensor [N], None: the predicted class, or "labels": y of (x, y) batches),
            clusters and settings. A method fitted to the clusters (`probe`) needs them,
            and is fitted on all samples.
        user_scores: optional scores from one's own code for the same method and samples
            (the analysed ones: the cluster's when the view has one, whose rows are also
            taken from rows for every sample): per-sample [m, n] (or [k, m, n]), or one
            cluster score [n] (compared with the signed mean).
        metric, ablation: what the evidence curve of not_better_than_random measures, and
            what a removed neuron's output becomes (as in `pruning_curve`).
        oracle_neurons: how many neurons disagrees_with_ablation ablates exactly, drawn at
            random, on every sample (all: the layer's n or more); None = as the plan says.
        plan: the sizes of exact ablation and of the evidence curve (`diagnose_plan_on`,
            made with oracle_neurons); None = that plan of this view: the full work
            where it fits `oracle_sample.ORACLE_SECONDS` and `costs.CURVE_SECONDS`, else a
            random sample of the neurons (and samples) and fewer k (and samples), said in
            the findings.
        progress: called as progress(fraction, findings_so_far); may raise to stop.
    Returns:
        One `Finding` per check in `CHECKS` order; incomplete_integral only for a method
        whose scores have a sum to check (`Method.sums_to`), suspicious_gradient_capture only
        when user_scores is given; only non_finite when the logits or scores are not finite. The
        not_better_than_random finding carries the pruning curve it rests on (`curve`): the
        cluster's `reduce` scores ranking its neurons, `metric` on its samples.
    """
    s = view.settings
    check_method(s.method)
    if plan is not None and oracle_neurons is not None:
        raise AttributionError("Pass oracle_neurons to diagnose_plan, or to diagnose without "
                               "a plan, not both.")
    model, layer, n_steps = view.placed(), view.layer, view.steps()
    x, targets = _materialise(model, view.inputs, view.targets, s.batch_size)
    names, codes = _analysed(view.clusters, s.cluster, x.shape[0])
    sample_ids = np.flatnonzero(codes >= 0)  # the analysed samples' positions in the inputs
    options = dict(batch_size=s.batch_size, n_steps=n_steps, seed=s.seed)

    def report(fraction: float, findings: list) -> None:
        if progress is not None:
            progress(fraction, list(findings))

    measured = _measure(model, layer, x, targets, s.method, view.clusters, codes, options,
                        progress=lambda fraction: report(0.2 * fraction, []))
    if s.cluster is not None:
        if isinstance(user_scores, torch.Tensor):
            user_scores = user_scores.detach().cpu().numpy()
        if user_scores is not None and np.ndim(user_scores) == 2 and len(user_scores) == len(codes):
            user_scores = np.asarray(user_scores)[codes >= 0]  # every sample's rows given
        codes = codes[codes >= 0]
    x, targets, scores, logits = measured.x, measured.targets, measured.scores, measured.logits
    gradients, activations = measured.gradients, measured.activations
    report(0.2, [])
    if not (np.isfinite(scores).all() and torch.isfinite(logits).all()):
        finding = check.non_finite(scores, logits.numpy(), sample_ids)
        report(1.0, [finding])
        return [finding]
    if plan is None:
        plan = _plan(model, layer, x, targets, codes, oracle_neurons, s.n_random, s.seed,
                     s.batch_size, view.device)
    if s.method == "ablation":  # exact on every neuron already
        oracle = OracleSample(np.arange(scores.shape[1]), scores.shape[1], scores)
    else:
        oracle = sample_oracle(model, layer, x, targets, plan.oracle, codes,
                               batch_size=s.batch_size, seed=s.seed)
    reach = _reach(model, layer, x, gradients, activations, codes, options)
    report(0.4, [])

    groups = _groups(names, codes, measured, oracle, reach, s.reduce, s.seed)
    labelled = len(groups) > 1
    everywhere_dead = check.dead_mask(reach, activations)
    findings = [Finding("non_finite", "ok", "Every score is finite.", 0.0)]

    def worst(results: list) -> Finding:  # each check's worst cluster
        return check.worst(results, groups, labelled)

    findings.append(worst([check.constant(g) for g in groups]))
    findings.append(worst([check.tiny(g, s.method) for g in groups]))
    findings.append(worst([check.cancellation(g, s.reduce) for g in groups]))
    zeroed = _zero_weights_after(model, layer)
    findings.append(worst([check.dead_neurons(g, everywhere_dead, zeroed) for g in groups]))
    report(0.5, findings)
    curves = []
    for position, group in enumerate(groups):
        curves.append(check.evidence_curve(model, layer, group, metric, ablation, plan.curve,
                                           s.seed, s.batch_size))
        report(0.5 + 0.4 * (position + 1) / len(groups), findings)
    findings.insert(1, worst([check.flat(g, c, metric) for g, c in zip(groups, curves)]))
    findings.append(worst([check.random_baseline(
        curve, check.metric_term(metric, g), plan.curve.n_random,
        plan.curve.words(len(g.cluster_score), (curve.attrs["n_samples"], len(g.x)),
                         "the cluster's")) for g, curve in zip(groups, curves)]))
    findings.append(worst([check.oracle(g, s.reduce, np.random.default_rng([s.seed, position]))
                           for position, g in enumerate(groups)]))
    checked = sum_check(measured.sums, n_steps)
    if checked is not None:
        findings.append(integral_finding(checked, s.method, n_steps))
    if user_scores is not None:
        findings.append(check.capture(user_scores, scores, s.method))
    report(1.0, findings)
    return findings


def diagnose_cost(model: nn.Module, layer, inputs: Inputs, targets=None,
                  method: str = DEFAULT_METHOD, clusters=None, *, cluster=None,
                  **options) -> SampledCost:
    """The seconds `diagnose(model, layer, inputs, targets, method, clusters, cluster=...,
    **options)` will take, said before it runs: `diagnose_cost_on` its view."""
    on_view = {key: options.pop(key) for key in _CHECK_OPTIONS if key in options}
    view = View.of(model, layer, inputs, targets, clusters, method=method, cluster=cluster,
                   **options)
    return diagnose_cost_on(view, **on_view)


_CHECK_OPTIONS = tuple(inspect.signature(diagnose_on).parameters)[1:]
"""`diagnose_on`'s options besides the view, read from its signature: an option added there
is one `diagnose_cost` passes on, not a setting of the view."""


def diagnose_cost_on(view: View, **checks) -> SampledCost:
    """The seconds `diagnose_on(view, **checks)` will take, said before it runs. Its plan
    (`diagnose_plan_on`, made first on every sample unless given as plan=, and kept: the
    run ablates the same neurons on the same samples and draws the same curve) sizes its
    two long parts, exact ablation and the evidence curve. Where exact ablation is exact
    (every neuron on every sample), the curve runs on every sample and the data is more
    than one timing's sample, diagnose itself is timed on samples that keep every cluster
    (`costs.sampled_cost`) and extrapolated: every part grows with the samples. Where the
    plan sized exact ablation to its budget (a sample of the neurons or of the samples:
    timed by the plan already) or measures a share of the samples for the curve, or one
    sample would be all the data (the estimate would cost the work), those two parts are
    taken at the plan's seconds and only the rest is timed (the scores, gradients,
    activations and logits, the bootstrap and the agreement, on the scores in the
    ablation's place), on an eighth and a quarter of the samples where they are under two
    batches (`costs.part_sizes`). In-memory inputs only (a tensor, an array or named
    inputs)."""
    s = view.settings
    check_method(s.method)
    if checks.get("plan") is None:
        checks["plan"] = diagnose_plan_on(view, oracle_neurons=checks.pop("oracle_neurons",
                                                                          None))
    plan = checks["plan"]
    total = model_io.n_rows(model_io.named(view.inputs))
    if plan.oracle.exact and plan.curve.share >= 1 and \
            probe_sizes(total, s.batch_size)[0] < total:
        def run(sample) -> None:
            diagnose_on(replace(view, inputs=sample(view.inputs), targets=sample(view.targets),
                                clusters=sample(view.clusters)), **checks)

        return sampled_cost("diagnose", run, view.inputs, view.clusters, s.batch_size)
    placed = view.placed()
    measures = dict(batch_size=s.batch_size, n_steps=view.steps(), seed=s.seed)

    def rest(sample) -> None:  # diagnose on `sample` but for ablation and the curve
        x, chosen = _materialise(placed, sample(view.inputs), sample(view.targets),
                                 s.batch_size)
        names, codes = _analysed(sample(view.clusters), s.cluster, x.shape[0])
        measured = _measure(placed, view.layer, x, chosen, s.method, sample(view.clusters),
                            codes, measures)
        neurons = np.arange(min(plan.oracle.neurons, measured.scores.shape[1]))
        stand_in = OracleSample(neurons, measured.scores.shape[1],  # its shape, not its passes
                                measured.scores[:, neurons])
        groups = _groups(names, codes[codes >= 0], measured, stand_in,
                         np.abs(measured.gradients), s.reduce, s.seed)
        for position, group in enumerate(groups):
            check.oracle(group, s.reduce, np.random.default_rng([s.seed, position]))

    timed = sampled_cost("the scores", rest, view.inputs, view.clusters, s.batch_size,
                         sizes=part_sizes(total, s.batch_size))
    planned = [("exact ablation", plan.oracle.seconds)] if s.method != "ablation" else []
    return timed.with_planned(*planned, ("the evidence curve", plan.curve.seconds))


def diagnose_plan(model: nn.Module, layer, inputs: Inputs, targets=None, clusters=None, *,
                  cluster=None,
                  oracle_neurons: Optional[int] = None, n_random: int = DEFAULT_N_RANDOM,
                  seed: int = DEFAULT_SEED, batch_size: int = DEFAULT_BATCH_SIZE,
                  device=None) -> DiagnosePlan:
    """What `diagnose` will measure exactly: `diagnose_plan_on` the view of these
    arguments."""
    view = View.of(model, layer, inputs, targets, clusters, cluster=cluster,
                   n_random=n_random, seed=seed, batch_size=batch_size, device=device)
    return diagnose_plan_on(view, oracle_neurons=oracle_neurons)


def diagnose_plan_on(view: View, oracle_neurons: Optional[int] = None) -> DiagnosePlan:
    """What `diagnose_on(view)` will measure exactly on the samples it analyses (the view's
    cluster's, where it has one), timed now (`oracle_sample.oracle_timing`): exact ablation
    of every neuron where it fits `oracle_sample.ORACLE_SECONDS`, else of a random sample
    of them (and of the samples), or of `oracle_neurons` on every sample; the evidence
    curve at EVIDENCE_CURVE_POINTS k steps where it fits `costs.CURVE_SECONDS`, else fewer
    (and a share of the samples). A front end passes it to `diagnose_cost_on` and
    `diagnose_on` alike. In-memory inputs only."""
    s = view.settings
    names, codes = _analysed(view.clusters, s.cluster,
                             model_io.n_rows(model_io.named(view.inputs)))
    rows = torch.from_numpy(np.flatnonzero(codes >= 0))
    kept = model_io.take(model_io.named(view.inputs), rows)
    targets = view.targets[rows] if isinstance(view.targets, torch.Tensor) else None
    return _plan(view.model, view.layer, kept, targets, codes[codes >= 0], oracle_neurons,
                 s.n_random, s.seed, s.batch_size, view.device)


def _plan(model, layer, x, targets, codes: np.ndarray,
          oracle_neurons: Optional[int], n_random: int, seed: int, batch_size: int,
          device) -> DiagnosePlan:
    """`diagnose_plan_on` the analysed samples `x` of cluster `codes` [N]."""
    fixed, per_pass, n_neurons = oracle_timing(model, layer, x, targets,
                                               batch_size=batch_size, device=device)
    oracle = plan_of_timing(fixed, per_pass, n_neurons, codes, seed=seed)
    if oracle_neurons is not None:
        oracle = oracle.exactly(oracle_neurons)
    return DiagnosePlan(oracle, plan_curve(fixed, per_pass, n_neurons, codes, n_random,
                                           EVIDENCE_CURVE_POINTS, seed=seed))


# ------------------------------------------------------------------------------ inputs

@dataclass(frozen=True)
class _Measured:
    """What diagnose measures before exact ablation and the evidence curve, on the analysed
    samples (m of them): their inputs `x` [m, ...] and `targets` [m] (or None), `method`'s
    `scores`, the `gradients` and `activations` [m, n] each, the `logits` [m, classes], and
    a path method's `sums` per sample (else None)."""

    x: torch.Tensor
    targets: Optional[torch.Tensor]
    scores: np.ndarray
    logits: torch.Tensor
    gradients: np.ndarray
    activations: np.ndarray
    sums: Optional[PathSums]


def _measure(model, layer, x: torch.Tensor, targets, method: str, clusters, codes: np.ndarray,
             options: dict, progress: Optional[Callable[[float], None]] = None) -> _Measured:
    """`_Measured` of the samples whose `codes` [N] are >= 0, of every sample's inputs `x`
    [N, ...] and `targets` [N]. A method fitted to the clusters is fitted on every sample;
    `progress(fraction)` follows the method's scores."""
    analysed = codes >= 0
    scores = None
    if REGISTRY[method].fit is not None:
        scores = neuron_scores(model, layer, x, targets, method, clusters=clusters,
                               **options).numpy()[analysed]
    if not analysed.all():
        keep = torch.from_numpy(analysed)
        x, targets = x[keep], (targets[keep] if targets is not None else None)
    facts = ScoreFacts()
    if scores is None:
        scores = neuron_scores(model, layer, x, targets, method, progress=progress,
                               facts=facts, **options).numpy()
    logits = _logits(model, x, options["batch_size"])
    gradients = (scores if method == "gradient"
                 else neuron_scores(model, layer, x, targets, "gradient", **options).numpy())
    activations = neuron_scores(model, layer, x, targets, "activation", **options).numpy()
    return _Measured(x, targets, scores, logits, gradients, activations, facts.sums)


def _groups(names: list, codes: np.ndarray, measured: _Measured, oracle: OracleSample,
            reach: np.ndarray, reduce: str, seed: int) -> list[check.Evidence]:
    """One `check.Evidence` per cluster of `names`, of the analysed samples of `codes` [m]
    (index into names), with its bootstrap resamples (the same for the same seed)."""
    x, targets, logits = measured.x, measured.targets, measured.logits
    generator = np.random.default_rng(seed)
    groups = []
    for index, name in enumerate(names):
        rows = np.flatnonzero(codes == index)
        part = torch.from_numpy(rows)
        group_scores = measured.scores[rows]
        groups.append(check.Evidence(
            name, x[part], targets[part] if targets is not None else None, group_scores,
            reduce_scores(group_scores, reduce), measured.gradients[rows],
            measured.activations[rows], oracle.rows(rows),
            float(logits[part].double().std()) if len(rows) else 0.0, reach[rows],
            bootstrap_counts(max(1, len(rows)), BOOTSTRAP_DRAWS, generator),
            logits.shape[1] == 1))
    return groups


def _materialise(model, inputs: Inputs, targets, batch_size: int):
    """(x [N, ...] on the model's device, targets LongTensor [N] or None)."""
    layer_pass = LayerPass(model, None, inputs, targets, batch_size=batch_size, grad=False,
                           accepts=("labels",), what="diagnose",
                           need="diagnose needs one target per sample")
    batches = [batch for batch, _ in layer_pass.run(lambda batch: None)]
    x = model_io.cat([batch.x for batch in batches])
    if layer_pass.targets is None:
        return x, None
    if isinstance(layer_pass.targets, torch.Tensor):  # one per sample, not more
        return x, check_targets(layer_pass.targets, model_io.n_rows(x)).cpu()
    return x, torch.cat([batch.targets for batch in batches]).cpu()  # the y of each batch


def _analysed(clusters, cluster, total: int) -> tuple[list, np.ndarray]:
    """(cluster names, codes [N]: index into names, -1 = not analysed)."""
    if clusters is None:
        if cluster is not None:
            raise AttributionError("cluster= needs clusters= (one cluster id per sample).")
        return ["all"], np.zeros(total, dtype=np.int64)
    codes, ids = cluster_codes(clusters, total)
    if cluster is None:
        return list(ids), codes
    cluster = find_cluster(cluster, ids)
    return [cluster], np.where(codes == ids.get_loc(cluster), 0, -1)


def _logits(model, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    layer_pass = LayerPass(model, None, x, batch_size=batch_size, grad=False)
    return torch.cat([logits for _, logits in layer_pass.run(
        lambda batch: run_logits(layer_pass.model, batch.x).float().cpu())])


def _reach(model: nn.Module, layer, x: torch.Tensor, gradients: np.ndarray,
           activations: np.ndarray, codes: np.ndarray, options: dict) -> np.ndarray:
    """[m, n] sum over classes of |dF_c/dz|. Computed only when the target's gradient is 0
    on all of a cluster's samples while the output is not (e.g. the other logits of an
    output layer for a one-class cluster); otherwise |target gradient| decides the same."""
    reach = np.abs(gradients)
    if any(((gradients[codes == code] == 0).all(0) & (activations[codes == code] != 0).any(0)
            ).any() for code in np.unique(codes)):
        for start, part in score_batches(model, layer, x, "all", "gradient", **options):
            reach[start:start + len(part)] = part.abs().sum(1).numpy()
    return reach


def _zero_weights_after(model: nn.Module, layer) -> list[str]:
    """Weights after `layer` (in module order) that are exactly 0 on whole channels, e.g.
    "bn3.weight (64 of 64 channels)": a BatchNorm gamma initialised to 0 (timm's
    zero_init_last) removes what flows through it, so the layers before it get no gradient."""
    name = resolve_layer(model, layer)[0].split(":")[0]
    found, after = [], False
    for module_name, module in model.named_modules():
        if module_name == name:
            after = True
            continue
        weight = getattr(module, "weight", None)
        if not after or not isinstance(weight, torch.Tensor) or weight.numel() == 0 \
                or not weight.dtype.is_floating_point:
            continue
        zero = (weight.detach().reshape(weight.shape[0], -1) == 0).all(1)
        if zero.any():
            found.append(f"{module_name}.weight ({int(zero.sum())} of {zero.numel()} channels)")
    return found

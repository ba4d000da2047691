"""What every page works on (`Context`): the workspace, the sidebar's choices and the clusters
they imply, with the cached calls into `attribution` that the pages make through it.

Results are cached with st.cache_data, keyed by (workspace, layer, method, target, clusters,
settings) (`keys`); arguments with a leading underscore are not hashed, and the string keys
next to them identify their contents. Pages only draw; every computation is a call into
`attribution`, made here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import numpy as np
import streamlit as st
import torch

import attribution as at
import attribution.progress
from attribution.analyses.costs import CurvePlan, SampledCost
from attribution.analyses.diagnose import (DiagnosePlan, diagnose_cost_on, diagnose_plan_on,
                                          for_checks)
from attribution.analyses.findings import Finding, integral_finding
from attribution.analyses.oracle_sample import OraclePlan
from attribution.analyses.path_steps import (StepsChoice, StepsPlan, layer_plans, plan_steps,
                                            takes_steps)
from attribution.analyses.scorecard import scorecard_cost_on, scorecard_oracle_plans_on
from attribution.analyses.view import (View, curve_cost_on, pruned_model_file_on,
                                      pruning_curves_on)
from attribution.methods import REGISTRY
from attribution.methods.paths import PathSums, sum_check
from attribution.methods.scores import ScoreFacts
from attribution.presentation import plots
from attribution.analyses.settings import (SCORECARD_METHODS, AnalysisSettings,
                                           DEFAULT_BATCH_SIZE, DEFAULT_N_STEPS,
                                           cluster_label, is_regression)
from attribution.analyses.verdict import (Remedy, TriedRemedy, Verdict, dominant_class,
                                          try_remedies)
from pages.shared import keys
from pages.shared.progress import ProgressLine
from pages.shared.stoppable import StoppableRun
from pages.shared.workspace import Workspace, cluster_ids, predictions


@st.cache_data(max_entries=64, show_spinner="Scoring neurons…")
def _per_sample(key: str, layer: str, method: str, target_key: str, partition_key: str,
                batch_size: int, n_steps: int, _model, _inputs: torch.Tensor,
                _targets: Optional[torch.Tensor], _clusters: Optional[np.ndarray],
                _progress) -> tuple[np.ndarray, Optional[tuple[str, bool]], Optional[PathSums]]:
    """(scores [N, n], a fitted method's (note, usable) else None, a path method's sums per
    sample else None): what `neuron_scores` learns (`ScoreFacts`), the fit kept as words;
    `_clusters` (with its `partition_key`) only for a method fitted to them."""
    facts = ScoreFacts()
    with _progress:
        scores = at.neuron_scores(_model, layer, _inputs, _targets, method,
                                  batch_size=batch_size, n_steps=n_steps, progress=_progress,
                                  clusters=_clusters, facts=facts).numpy()
    fit = None if facts.fit is None else (facts.fit.note, facts.fit.usable)
    return scores, fit, facts.sums


@st.cache_data(max_entries=16, show_spinner="Running the degeneracy checks…")
def _findings(key: str, layer: str, method: str, target_key: str, cluster_key: str,
              reduce: str, batch_size: int, n_steps: int, user_key: str, plan_key: str,
              _plan: DiagnosePlan, _view: View, _user_scores, _progress) -> list:
    """The checks (`diagnose_on`); `_progress` is told the findings so far."""
    with _progress:
        return at.diagnose_on(_view, user_scores=_user_scores, plan=_plan,
                              progress=_progress)


@st.cache_data(max_entries=256, show_spinner="Timing the path method on a sample…")
def _steps_plan(key: str, layer: str, method: str, target_key: str, batch_size: int, _model,
                _inputs, _targets) -> StepsPlan:
    return plan_steps(_model, layer, _inputs, _targets, method, batch_size=batch_size)


@st.cache_data(max_entries=16, show_spinner="Timing exact ablation on a sample…")
def _diagnose_plan(key: str, layer: str, target_key: str, cluster_key: str, batch_size: int,
                   _view: View) -> DiagnosePlan:
    return diagnose_plan_on(_view)


@st.cache_data(max_entries=16, show_spinner="Comparing every method with exact ablation…")
def _oracle(key: str, layer: str, methods: tuple, target_key: str, cluster_key: str,
            reduce: str, batch_size: int, steps: tuple, plan_key: str, _plan: OraclePlan,
            _view: View, _progress):
    """`oracle_agreement_on` the view (its steps: `steps`)."""
    with _progress:
        table = at.oracle_agreement_on(_view, methods, oracle_neurons=_plan,
                                       progress=_progress)
    return table.drop(columns="cluster")


@st.cache_data(max_entries=8, show_spinner="Measuring every method on every layer…")
def _scorecard(key: str, target_key: str, partition_key: str, metric: str, batch_size: int,
               methods: tuple, plans_key: str, _plans: dict, _view: View, _curve_targets,
               _progress, _resume):
    """The scorecard (`scorecard_on` the view, whose steps the plans' key names), resumed
    from `_resume` (a partial card of the same key, or None): the same card either way, so
    the resumed part is not in the key."""
    with _progress:
        return at.scorecard_on(_view, methods=methods, metric=metric,
                               curve_targets=_curve_targets, oracle_neurons=_plans,
                               progress=_progress, resume=_resume)


@st.cache_data(max_entries=8, show_spinner="Timing exact ablation on every layer…")
def _scorecard_oracle_plans(key: str, target_key: str, partition_key: str, batch_size: int,
                            _view: View) -> dict:
    return scorecard_oracle_plans_on(_view)


@st.cache_data(max_entries=16, show_spinner="Timing the checks on a sample…")
def _findings_cost(key: str, layer: str, method: str, target_key: str, cluster_key: str,
                   reduce: str, batch_size: int, n_steps: int, plan_key: str,
                   _plan: DiagnosePlan, _view: View) -> SampledCost:
    return diagnose_cost_on(_view, plan=_plan)


@st.cache_data(max_entries=8, show_spinner="Timing the scorecard on a sample…")
def _scorecard_cost(key: str, target_key: str, partition_key: str, metric: str,
                    batch_size: int, methods: tuple, plans_key: str, _plans: dict,
                    _view: View, _curve_targets) -> SampledCost:
    return scorecard_cost_on(_view, methods=methods, metric=metric,
                             curve_targets=_curve_targets, oracle_neurons=_plans)


@st.cache_data(max_entries=16, show_spinner=False)
def _curve_cost(curve_key: tuple, _view: View):
    return curve_cost_on(_view)


@st.cache_data(max_entries=32, show_spinner=False)
def _curve_plan(curve_key: tuple, full: bool, _settings: AnalysisSettings, _cost,
                _clusters) -> CurvePlan:
    return _settings.curve_plan(_cost, _clusters, full=full)


@dataclass(frozen=True)
class Context:
    """What every page works on: the workspace, the choices, and the clusters they imply."""

    ws: Workspace
    settings: AnalysisSettings
    clusters: np.ndarray
    targets: Optional[torch.Tensor]
    exact_oracle: bool = False  # every neuron ablated exactly, whatever it costs
    full_curve: bool = False  # the pruning curves at their full size, whatever they cost
    every_step: bool = False  # path methods at every step asked, whatever they cost

    @property
    def target_key(self) -> str:
        return keys.target_key(self.settings)

    @property
    def cluster_key(self) -> str:
        return keys.cluster_key(self.settings)

    @property
    def focus(self) -> np.ndarray:
        """bool [N]: the samples of the cluster in focus."""
        return self.settings.cluster_rows(self.clusters)

    @property
    def regression(self) -> bool:
        """Is the model a regression head (one output, no classes)?"""
        return is_regression(self.ws.loaded.n_classes)

    @property
    def layer_info(self) -> at.LayerInfo:
        """The layer in focus, with the neuron axis of `settings.layer` ("name" or "name:axis")."""
        return self.settings.layer_info(self.ws.layers)

    @property
    def n_neurons(self) -> int:
        return self.layer_info.n_neurons

    # each long computation below draws its ProgressLine when it is computed, not cached

    def scores(self, method: str) -> np.ndarray:
        """Per-sample scores [N, n_neurons] of `method` on every sample (cached)."""
        return self._scored(method)[0]

    def fit_note(self, method: str) -> Optional[tuple[str, bool]]:
        """(what `method` says of its fit to the clusters, e.g. a probe's accuracy; whether
        its scores rank anything), or None for a method not fitted to them."""
        return self._scored(method)[1]

    def sum_finding(self, method: str) -> Optional[Finding]:
        """Whether `method`'s scores of each sample sum to what they integrate (a path
        method: `Method.sums_to`), or None for a method without such a sum."""
        n_steps = self.n_steps(method)
        checked = sum_check(self._scored(method)[2], n_steps)
        return None if checked is None else integral_finding(checked, method, n_steps)

    def with_every_step(self, every: bool) -> "Context":
        """This context with path methods at every step asked (`every`) or as many as fit
        `path_steps.PATH_SECONDS` (a page's choice: the Scores, Diagnosis and Trust pages
        offer it)."""
        return replace(self, every_step=every)

    def steps_plan(self, method: str, settings: Optional[AnalysisSettings] = None
                   ) -> Optional[StepsPlan]:
        """The steps path `method` takes at the layer of `settings` (this view's when
        None): `layer_steps_plan`'s; None for a method without steps."""
        if not takes_steps(method):
            return None
        s = self.settings if settings is None else settings
        return self.layer_steps_plan(s.layer, method, s)

    def layer_steps_plan(self, layer: str, method: str,
                         settings: Optional[AnalysisSettings] = None) -> StepsPlan:
        """The steps of path `method` that fit `path_steps.PATH_SECONDS` on every sample at
        `layer` for the targets of `settings` (this view's when None) (`plan_steps`: timed
        once per data, layer and method, and cached: the Scores page's plan is the
        scorecard's), at the steps asked where `every_step`; may raise."""
        s = self.settings if settings is None else settings
        plan = _steps_plan(self.ws.key, layer, method, keys.target_key(s), s.batch_size,
                           self.ws.model, self.ws.data.inputs, self.targets)
        return plan.at_steps_asked() if self.every_step else plan

    def n_steps(self, method: str, settings: Optional[AnalysisSettings] = None) -> int:
        """The steps `method` takes here: its `steps_plan`'s, else DEFAULT_N_STEPS."""
        plan = self.steps_plan(method, settings)
        return DEFAULT_N_STEPS if plan is None else plan.n_steps

    def method_steps(self, methods: Sequence[str]) -> tuple[tuple[str, int], ...]:
        """((method, its `n_steps`), ...) for each path method of `methods` at this view's
        layer; one that refuses the layer has none (the analysis says why)."""
        steps = []
        for method in filter(takes_steps, methods):
            try:
                steps.append((method, self.n_steps(method)))
            except at.AttributionError:
                continue
        return tuple(steps)

    def _scored(self, method: str
                ) -> tuple[np.ndarray, Optional[tuple[str, bool]], Optional[PathSums]]:
        s = self.settings
        fitted = REGISTRY[method].fit is not None
        return _per_sample(self.ws.key, s.layer, method, self.target_key,
                           keys.partition_key(s) if fitted else "", s.batch_size,
                           self.n_steps(method), self.ws.model, self.ws.data.inputs, self.targets,
                           self.clusters if fitted else None,
                           ProgressLine(f"Scoring neurons by {plots.method_label(method)}"))

    def view(self, settings: Optional[AnalysisSettings] = None,
             clusters: Optional[np.ndarray] = None,
             n_steps: StepsChoice = DEFAULT_N_STEPS) -> View:
        """The analyses' view of `settings` on `clusters` (this context's when None): the
        workspace's model, inputs and labels, the targets scored, path methods at
        `n_steps`."""
        return View(self.ws.model, self.ws.data.inputs, self.targets,
                    self.clusters if clusters is None else clusters,
                    self.settings if settings is None else settings, n_steps,
                    labels=self.ws.data.labels)

    def checks_view(self, settings: Optional[AnalysisSettings] = None,
                    clusters: Optional[np.ndarray] = None,
                    n_steps: StepsChoice = DEFAULT_N_STEPS) -> View:
        """The degeneracy checks' `view` (`diagnose.for_checks`: their own random orders,
        which the cache keys of the checks leave out)."""
        return for_checks(self.view(settings, clusters, n_steps))

    def focus_targets(self) -> Optional[torch.Tensor]:
        return None if self.targets is None else self.targets[torch.from_numpy(self.focus)]

    def focus_inputs(self) -> torch.Tensor:
        return self.ws.data.inputs[torch.from_numpy(self.focus)]

    def findings(self, user_scores: Optional[np.ndarray] = None, user_key: str = "",
                 run: Optional[StoppableRun] = None) -> list:
        """The degeneracy checks of the cluster in focus (cached); `run`
        (`findings_run`) keeps the findings so far."""
        s = self.settings
        plan = self.diagnose_plan(s)
        return _findings(*self._findings_key(user_key), plan,
                         self.checks_view(s, n_steps=self.n_steps(s.method)), user_scores,
                         ProgressLine("Running the degeneracy checks", keep=run and run.keep))

    def findings_run(self, user_key: str = "") -> StoppableRun:
        """The state of the checks' run (`findings`) in this session."""
        return StoppableRun(st.session_state, ("findings",) + self._findings_key(user_key))

    def _findings_key(self, user_key: str) -> tuple:
        s = self.settings
        return (self.ws.key, s.layer, s.method, self.target_key, self.cluster_key, s.reduce,
                s.batch_size, self.n_steps(s.method), user_key, repr(self.diagnose_plan(s)))

    def findings_cost(self, settings: Optional[AnalysisSettings] = None,
                      clusters: Optional[np.ndarray] = None) -> SampledCost:
        """What `findings` of `settings` on `clusters` (this view's when None) will take,
        said before it runs (`diagnose_cost`: timed on a sample that keeps every cluster;
        cached)."""
        s = self.settings if settings is None else settings
        clusters = self.clusters if clusters is None else clusters
        plan, n_steps = self.diagnose_plan(s, clusters), self.n_steps(s.method, s)
        return _findings_cost(self.ws.key, s.layer, s.method, keys.target_key(s),
                              keys.cluster_key(s), s.reduce, s.batch_size, n_steps,
                              repr(plan), plan, self.checks_view(s, clusters, n_steps))

    def with_exact_oracle(self, exact: bool) -> "Context":
        """This context with every neuron ablated exactly (`exact`) or as many as fit the
        oracle's budget (a page's choice: the Diagnosis and Trust pages offer it)."""
        return replace(self, exact_oracle=exact)

    def diagnose_plan(self, settings: Optional[AnalysisSettings] = None,
                      clusters: Optional[np.ndarray] = None) -> DiagnosePlan:
        """What the checks of `settings` (this view's when None) on `clusters` measure
        exactly (`diagnose_plan`, timed once per view and cached): the budget's, with every
        neuron on every sample where `exact_oracle`."""
        s = self.settings if settings is None else settings
        clusters = self.clusters if clusters is None else clusters
        plan = _diagnose_plan(self.ws.key, s.layer, keys.target_key(s), keys.cluster_key(s),
                              s.batch_size, self.checks_view(s, clusters))
        return plan.with_oracle_neurons() if self.exact_oracle else plan

    def oracle_plan(self, settings: Optional[AnalysisSettings] = None,
                    clusters: Optional[np.ndarray] = None) -> OraclePlan:
        """The exact ablation the checks of `settings` and the oracle table measure
        (`diagnose_plan`'s oracle)."""
        return self.diagnose_plan(settings, clusters).oracle

    def tried_remedies(self, answer: Verdict, findings: list) -> tuple[TriedRemedy, ...]:
        """The verdict's remedies, each measured on the view it leads to (`try_remedies`):
        those that improve the verdict first. A change to one-class clusters continues
        with the most common class of the cluster in focus."""
        s = self.settings
        placed = tuple(self._placed(remedy) for remedy in answer.remedies)
        return try_remedies(replace(answer, remedies=placed), findings, self._remedy_view,
                            method=s.method, reduce=s.reduce, cluster_source=s.cluster_source,
                            has_labels=self.ws.data.labels is not None)

    def _placed(self, remedy: Remedy) -> Remedy:
        """A cluster_source remedy with the cluster to show after it."""
        if remedy.choice != "cluster_source":
            return remedy
        classes = (self.ws.data.labels.numpy() if remedy.value == "label"
                   else self.predictions())
        return replace(remedy, cluster=dominant_class(self.clusters, classes,
                                                      self.settings.cluster))

    def remedies_cost(self, answer: Verdict, checks_seconds: float) -> float:
        """Seconds `tried_remedies(answer, ...)` will take, where this view's checks take
        `checks_seconds`: the sum of each remedy's view's `findings_cost` (its plan timed
        now, and kept for the work); where the checks take less than a progress line is
        worth, that many seconds per remedy (pricing each view would cost more than
        measuring it)."""
        if not attribution.progress.worth_saying(checks_seconds):
            return checks_seconds * len(answer.remedies)
        views = (self._remedy_settings(self._placed(remedy)) for remedy in answer.remedies)
        return sum(self.findings_cost(settings, clusters).seconds
                   for settings, clusters, _ in views)

    def remedies_run(self, answer: Verdict) -> StoppableRun:
        """The state of the measuring of `answer`'s remedies (`tried_remedies`) in this
        session."""
        return StoppableRun(st.session_state, ("remedies",) + self._findings_key("") + tuple(
            (remedy.choice, remedy.value) for remedy in answer.remedies))

    def _remedy_view(self, remedy: Remedy) -> tuple[list, str]:
        """(the findings of the view `remedy` leads to, "" or which samples it compares)."""
        settings, clusters, samples = self._remedy_settings(remedy)
        return self._findings_of(settings, clusters), samples

    def _remedy_settings(self, remedy: Remedy) -> tuple[AnalysisSettings, np.ndarray, str]:
        """(the settings `remedy` (placed) leads to, their clusters, "" or which samples
        they compare)."""
        s = self.settings
        if remedy.choice != "cluster_source":
            return replace(s, **{remedy.choice: remedy.value}), self.clusters, ""
        changed = replace(s, cluster_source=remedy.value, cluster=remedy.cluster)
        clusters = cluster_ids(self.ws.key, remedy.value, s.k, "", DEFAULT_BATCH_SIZE,
                               self.ws.loaded, self.ws.data,
                               ProgressLine("Grouping samples into clusters"))
        after = int((np.asarray(clusters) == remedy.cluster).sum())
        samples = (f"compares the {after} samples of "
                   f"{cluster_label(remedy.cluster, remedy.value, self.ws.class_names)} (the "
                   f"most common class of this cluster), not these {int(self.focus.sum())}")
        return changed, clusters, samples

    def _findings_of(self, settings: AnalysisSettings, clusters: np.ndarray) -> list:
        s = settings
        plan, n_steps = self.diagnose_plan(s, clusters), self.n_steps(s.method, s)
        return _findings(self.ws.key, s.layer, s.method, keys.target_key(s),
                         keys.cluster_key(s), s.reduce, s.batch_size, n_steps, "", repr(plan),
                         plan, self.checks_view(s, clusters, n_steps), None,
                         ProgressLine("Trying a remedy"))

    def focus_scored_classes(self) -> torch.Tensor:
        """The class each sample of the cluster in focus is scored for, with the predicted
        class where the targets say "predicted" (None)."""
        targets = self.focus_targets()
        if targets is None and self.regression:  # its one output
            targets = torch.zeros(int(self.focus.sum()), dtype=torch.long)
        elif targets is None:  # the predicted class
            targets = torch.from_numpy(self.predictions()[self.focus])
        return targets

    def focus_labels(self) -> Optional[torch.Tensor]:
        """The labels of the cluster in focus, or None for data without labels."""
        return None if self.ws.data.labels is None else \
            self.ws.data.labels[torch.from_numpy(self.focus)]

    def oracle(self, methods: Sequence[str]):
        """Agreement of `methods` with ablation on the cluster in focus (cached)."""
        s = self.settings
        plan, steps = self.oracle_plan(s), self.method_steps(methods)
        return _oracle(self.ws.key, s.layer, tuple(methods), self.target_key, self.cluster_key,
                       s.reduce, s.batch_size, steps, repr(plan), plan,
                       self.view(n_steps=dict(steps)),
                       ProgressLine("Comparing every method with exact ablation"))

    def scorecard(self, methods: Sequence[str] = SCORECARD_METHODS,
                  run: Optional[StoppableRun] = None):
        """`methods` on every layer against exact ablation, on the clusters of the sidebar's
        partition (cached; `attribution.scorecard`; a method that refuses a layer leaves its
        cell empty); `run` (`scorecard_run`) keeps the partial card, and a run cut off
        resumes from its layers done."""
        s = self.settings
        plans_key, plans, steps = self._scorecard_plans(methods)
        return _scorecard(self.ws.key, self.target_key, keys.partition_key(s), s.metric,
                          s.batch_size, tuple(methods), plans_key, plans,
                          self.view(n_steps=steps),
                          s.curve_targets(self.ws.data.labels, self.targets),
                          ProgressLine("Measuring every method on every layer",
                                       keep=run and run.keep), run and run.kept)

    def scorecard_run(self, methods: Sequence[str] = SCORECARD_METHODS) -> StoppableRun:
        """The state of the scorecard's run (`scorecard`) in this session."""
        s = self.settings
        return StoppableRun(st.session_state, (
            "scorecard", self.ws.key, self.target_key, keys.partition_key(s), s.metric,
            s.batch_size, tuple(methods), self._scorecard_plans(methods)[0]))

    def _scorecard_plans(self, methods: Sequence[str]) -> tuple[str, dict, dict]:
        """(a key, {layer: the oracle its column measures}, {"layer/method": a path
        method's steps}) for the scorecard and its estimate alike: every neuron on every
        sample with `exact_oracle`, else as many as fit the budget; the steps of
        `scorecard_steps` (every step asked with `every_step`)."""
        plans = {layer: plan.exactly() if self.exact_oracle else plan
                 for layer, plan in self.scorecard_oracle_plans().items()}
        steps = {key: plan.n_steps for key, plan in self.scorecard_steps(methods).items()}
        return repr((sorted(plans.items()), sorted(steps.items()))), plans, steps

    def scorecard_steps(self, methods: Sequence[str] = SCORECARD_METHODS
                        ) -> dict[str, StepsPlan]:
        """{"layer/method": `layer_steps_plan` of each path method of `methods` on every
        layer that takes it} (`path_steps.layer_plans`, as `plan_layer_steps`, each plan
        cached alone)."""
        return layer_plans([info.spec for info in self.ws.layers], methods,
                           self.layer_steps_plan)

    def scorecard_oracle_plans(self) -> dict[str, OraclePlan]:
        """{layer: its default oracle} (`scorecard_oracle_plans`, timed once per data and
        partition, and cached)."""
        s = self.settings
        return _scorecard_oracle_plans(self.ws.key, self.target_key, keys.partition_key(s),
                                       s.batch_size, self.view())

    def scorecard_cost(self, methods: Sequence[str] = SCORECARD_METHODS) -> SampledCost:
        """What `scorecard(methods)` will take, said before it runs (`scorecard_cost`: timed
        on a sample that keeps every cluster; cached)."""
        s = self.settings
        plans_key, plans, steps = self._scorecard_plans(methods)
        return _scorecard_cost(self.ws.key, self.target_key, keys.partition_key(s), s.metric,
                               s.batch_size, tuple(methods), plans_key, plans,
                               self.view(n_steps=steps),
                               s.curve_targets(self.ws.data.labels, self.targets))

    def predictions(self) -> np.ndarray:
        return predictions(self.ws)

    def cluster_label(self, cluster: Any) -> str:
        return cluster_label(cluster, self.settings.cluster_source, self.ws.class_names)

    def pruning_curves(self, **run):
        """The focus cluster's pruning curves against the rest, ranked by the main method's
        cluster scores, at the size of `curve_plan` (`view.pruning_curves_on`);
        `run`: progress=, resume=."""
        s = self.settings
        return pruning_curves_on(self.view(), s.ranking(self.scores(s.method), self.clusters),
                                 plan=self.curve_plan(), **run)

    def curve_cost(self):
        """What the full pruning curves would cost (`view.curve_cost_on`), measured once per
        curve (a probe of a batch of samples)."""
        return _curve_cost(self._curve_settings_key(), self.view())

    def curve_plan(self) -> CurvePlan:
        """The pruning curves' size: sized to `costs.CURVE_SECONDS`, or every k on every
        sample with `full_curve` (`AnalysisSettings.curve_plan`; cached)."""
        return _curve_plan(self._curve_settings_key(), self.full_curve, self.settings,
                           self.curve_cost(), self.clusters)

    def with_full_curve(self, full: bool) -> "Context":
        """This context with the pruning curves at their full size whatever they cost
        (`full`), or sized to their budget (the Pruning page's choice)."""
        return replace(self, full_curve=full)

    def curve_ks(self) -> list[int]:
        """The k values of the pruning curves (`curve_plan`'s; every one of the settings'
        where the plan cannot be timed: the curve's own error then says why)."""
        try:
            return self.curve_plan().ks(self.n_neurons)
        except at.AttributionError:
            return self.settings.curve_ks(self.n_neurons)

    def pruned_model_file(self, k: int) -> bytes:
        """A .pt2 of the model with the layer's k lowest-ranked neurons removed, ranked as
        the pruning curves rank them (`view.pruned_model_file_on`)."""
        s = self.settings
        return pruned_model_file_on(self.view(), s.ranking(self.scores(s.method), self.clusters),
                                    k, class_names=self.ws.class_names)

    def _curve_settings_key(self) -> tuple:
        return keys.curve_key(self.ws.key, self.settings)

    def curve_key(self) -> tuple:
        """Everything the pruning curves are computed from: the settings, and the size
        their plan gives them (`curve_plan`; the settings alone where it cannot be timed)."""
        try:
            plan = self.curve_plan()
        except at.AttributionError:
            return self._curve_settings_key()
        return self._curve_settings_key() + (plan.points, plan.samples)


def context() -> Context:
    """The context the sidebar built in this run (app.py calls `sidebar` first)."""
    return st.session_state["context"]

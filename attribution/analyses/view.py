"""A view: one model's layer on one dataset with the analysis settings, bound once.

Every analysis of a layer reads the same things: the model, the inputs, the logit each sample
is scored for, the clusters, and the settings (layer, method, reduce, the cluster in focus,
random orders, batch size, seed), with the path methods' steps and the device. A `View`
holds them, and the analyses take it (`diagnose_on`, `oracle_agreement_on`, ...; the view's
own pruning curves are here: `pruning_curves_on`); the flat functions of the notebooks
(`diagnose(model, layer, inputs, ...)`) build one and call them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..methods.passes import on_device
from ..methods.scores import Inputs
from ..engine import model_io
from .costs import CurveCost, CurvePlan, curve_cost, draw_samples, take_rows
from .path_steps import StepsChoice, steps_in
from .prune import prune, save_pt2
from .pruning_curves import cluster_pruning_curves
from .settings import DEFAULT_ABLATION, DEFAULT_N_STEPS, AnalysisSettings


@dataclass(frozen=True)
class View:
    """What every analysis of one layer reads.

    Attributes:
        model: classifier returning logits [N, n_classes] (or a regression or multi-label
            head); every analysis leaves it exactly as it was found.
        inputs: [N, ...] tensor or array, named inputs, or (where an analysis says so) a
            re-iterable of batches.
        targets: the logit each sample is scored for, LongTensor [N] (or a head's own
            targets), or None: the predicted class.
        clusters: one cluster id per sample [N], or None: every sample in one cluster.
        settings: the choices behind the view (`AnalysisSettings`): `layer` (a dotted name,
            "name:axis", or the module itself), `method`, `reduce`, `n_random`,
            `batch_size`, `seed`, and `cluster`, the cluster analysed (None: every cluster).
            The layer is None in a view of the whole model (the scorecard's).
        n_steps: the path methods' steps, one number or {method: steps or StepsPlan}.
        device: where the analyses run (None: where the model is).
        labels: the true values [N] (class ids, or a regression head's values) that the
            pruning curves measure accuracy or squared error against; None: none known.
    """

    model: nn.Module
    inputs: Inputs
    targets: Optional[torch.Tensor]
    clusters: Optional[np.ndarray]
    settings: AnalysisSettings
    n_steps: StepsChoice = DEFAULT_N_STEPS
    device: Any = None
    labels: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, model: nn.Module, layer, inputs: Inputs, targets=None, clusters=None, *,
           n_steps: StepsChoice = DEFAULT_N_STEPS, device=None, **settings) -> "View":
        """The view of the flat arguments the notebook functions take: `settings` are
        `AnalysisSettings` fields (method=, reduce=, cluster=, n_random=, ...)."""
        return cls(model, inputs, targets, clusters, AnalysisSettings(layer=layer, **settings),
                   n_steps, device)

    def with_settings(self, **changes) -> "View":
        """This view with some settings changed (cluster=, method=, ...)."""
        return replace(self, settings=replace(self.settings, **changes))

    @property
    def layer(self):
        """The layer analysed: a dotted name, "name:axis", or the module."""
        return self.settings.layer

    def placed(self) -> nn.Module:
        """The model on the view's device (the model itself where that is where it is)."""
        return on_device(self.model, self.device)

    @property
    def curve_targets(self) -> Optional[torch.Tensor]:
        """What the pruning curves measure against (`settings.curve_targets` of the view's
        metric): the labels, or the targets scored."""
        return self.settings.curve_targets(self.labels, self.targets)

    def steps(self, key: Optional[str] = None) -> int:
        """The path steps of `key` ("method" or "layer/method"; None: the view's method)."""
        return steps_in(self.n_steps, key or self.settings.method)


def pruning_curves_on(view: View, ranking: np.ndarray, plan: Optional[CurvePlan] = None,
                      **run) -> pd.DataFrame:
    """`cluster_pruning_curves` of the view's cluster against the rest of the data: its
    metric (`settings.metric`) against `View.curve_targets`, its random orders
    (`settings.n_random`) and seed.

    Args:
        ranking: [n] the scores that order the neurons (`AnalysisSettings.ranking`).
        plan: the curves' size (`AnalysisSettings.curve_plan`): its k values, on its share
            of the cluster's and of the rest's samples (`costs.draw_samples`); None: every
            one of `settings.curve_ks` on every sample.
        run: passed through: progress=, resume=.
    """
    s = view.settings
    inputs, measured, clusters = view.inputs, view.curve_targets, view.clusters
    ks = s.curve_ks(len(ranking)) if plan is None else plan.ks(len(ranking))
    if plan is not None and plan.share < 1:
        rows = draw_samples(s.cluster_rows(clusters).astype(np.int64), plan.share, s.seed)
        inputs, measured, clusters = (take_rows(value, rows)
                                      for value in (inputs, measured, clusters))
    return cluster_pruning_curves(
        view.model, view.layer, inputs, measured, clusters, s.cluster, ranking, ks=ks,
        n_random=s.n_random, seed=s.seed, metric=s.metric, batch_size=s.batch_size,
        device=view.device, **run)


def curve_cost_on(view: View) -> CurveCost:
    """What `pruning_curves_on(view, ...)` will cost at full size (`costs.curve_cost`), said
    before it runs."""
    s = view.settings
    return curve_cost(view.model, view.layer, view.inputs, view.curve_targets,
                      ks=s.curve_ks, n_random=s.n_random, seed=s.seed,
                      batch_size=s.batch_size)


def pruned_model_file_on(view: View, ranking: np.ndarray, k: int,
                         class_names: Optional[Sequence[str]] = None) -> bytes:
    """A .pt2 of the view's model with its layer's k lowest-ranked neurons (by `ranking`
    [n]) removed as `pruning_curves_on` removes them: its metric is their "bottom" point at
    k, per subset."""
    pruned = prune(view.model, view.layer, ranking, k, mode=DEFAULT_ABLATION, remove="bottom",
                   inputs=view.inputs, batch_size=view.settings.batch_size)
    return save_pt2(pruned, model_io.take(view.inputs, slice(0, 2)), class_names=class_names)

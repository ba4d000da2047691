"""Every analysis setting in one place: its default, its choices, the rules that pick a
setting from what the data has, how it is said in words, and `AnalysisSettings`, the settings
behind one view of the results.

The dashboard (sidebar and pages), its HTML report and the command line read their defaults
and choices here, so the same data opens the same view in each of them; the command line's
options and the dashboard's widgets are both made from one table, `SETTINGS` (a `Setting`
row per choice: flag, widget, label, help, values, default):

    source = default_cluster_source(has_labels, has_provided_clusters)   # "label" ...
    sources = cluster_source_choices(has_labels, has_provided_clusters)  # the menu, in order
    target, targets = default_target(has_labels), target_choices(has_labels)
    layer = default_layer(layers)                                          # a LayerInfo list
    settings = AnalysisSettings.for_data(layers, has_labels=True, has_provided_clusters=True)
    words = partition_words("kmeans_activations", k=8, layer="relu2")     # for the notices
    facts = DataFacts(layers, has_labels=True, has_provided_clusters=False, n_samples=500)
    SETTINGS["cluster_source"].menu(facts), SETTINGS["k"].default_of(facts)  # ("label", ...), 8

    settings = AnalysisSettings(layer="relu2", cluster=3, target="fixed", fixed_class=3)
    settings = settings.with_cluster_of(clusters)       # a cluster that exists ("3" -> 3)
    targets = settings.targets(dataset, n_classes=10)   # LongTensor [N], or None = predicted
    focus = settings.cluster_rows(clusters)              # bool [N]
    ranking = settings.ranking(per_sample, clusters)     # [n] the focus cluster's scores
    view = View(model, dataset.inputs, targets, clusters, settings, labels=dataset.labels)
    curves = pruning_curves_on(view, ranking)            # the analyses take it (`view`)

The scalar defaults that the library's own function signatures also take (method, reduce,
batch size, integration steps, seed, random orders, pruning metric, ablation) are defined in
`attribution.defaults`, below every layer, and re-exported here; everything else is defined
here. The defaults, and why:

- Method: DEFAULT_METHOD, gradient x activation. Its scores are in logits (a first-order
  estimate of what removing the neuron does), so they compare with exact ablation and across
  layers. The plain gradient is what the degeneracy check examines (averaged gradients
  cancel and look tiny), not the best default ranking. DEFAULT_COMPARE: the methods shown
  beside it (the plain gradient and exact ablation, the two it sits between).
- Cluster source: `default_cluster_source`: the true label when the data has labels, else the
  data's own cluster column, else the predicted class. With the default target (the true
  class) a cluster by label is one class scored for one logit, so its signed mean cannot
  cancel across classes (the remedy `verdict` proposes for sign cancellation), and clusters
  are named by class. A cluster column is the user's own grouping, so it comes next. Without
  either, the predicted class: the dashboard and the report must show clusters, and the
  predicted class exists for any data the model can score (one forward pass, also for data
  streamed from disk). One rule for every front end: the command line's score, curve
  --cluster and diagnose group unlabelled data by predicted class as the dashboard shows it
  (before, they put every sample in one cluster "all", and the report refused such data);
  `--clusters none` still asks for that single cluster.
- Target: `default_target`: the true class when the data has labels, else the predicted one.
- A regression head (one output, `is_regression`) has no classes: its score is the output
  itself (the only target), its labels are true values, grouped by quartile (clusters by
  "label", and by "predicted": the output's quartiles), and its curves measure the squared
  error against them (`default_metric`), else the output.
- Layer: `default_layer`: the last hidden activation (a ReLU or similar before the output).
- Reduction: the signed mean (DEFAULT_REDUCE); REDUCE_CHOICES are the dashboard's. It shows
  what a user's own averaging computes, and the degeneracy check says when it cancels.
- Pruning a model (`prune` on the command line, the take-away of the dashboard's ranking):
  DEFAULT_PRUNE_REDUCE, the mean magnitude. A signed mean ranks the neurons whose removal
  raises the target most at the bottom: "lowest" then means "most negative", and removing
  them can cost more than removing random neurons (a trained 1D-CNN lost a third of its
  accuracy to two of them). Every prune is measured against k random neurons
  (`prune.prune_check`) and, where exact ablation is estimated under PRUNE_ORACLE_SECONDS,
  against the k neurons whose exact removal changes the target least (ORACLE_CHOICES).
- k-means: DEFAULT_K clusters; `k_choices(n_samples)` the dashboard's k slider.
- Pruning curves: DEFAULT_METRIC (accuracy), DEFAULT_N_RANDOM random orders (RANDOM_ORDERS),
  DEFAULT_ABLATION, DEFAULT_SEED; DEFAULT_BATCH_SIZE samples per pass (BATCH_SIZES); the
  Pruning page's at CURVE_K_STEPS + 1 values of k where they fit PAGE_CURVE_SECONDS, else
  fewer k and then samples (`AnalysisSettings.curve_plan`).
- The degeneracy check's evidence curve: EVIDENCE_METRIC (the target logit) at
  EVIDENCE_CURVE_POINTS + 1 values of k (`evidence_ks`) where it fits `costs.CURVE_SECONDS`,
  else fewer k and then samples (`diagnose.diagnose_plan`); `diagnose` returns it.
- Intervals: BOOTSTRAP_DRAWS resamples of the samples. The scorecard: SCORECARD_METHODS on
  every layer, SCORECARD_N_RANDOM random orders at SCORECARD_CURVE_POINTS + 1 values of k.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ..defaults import (DEFAULT_ABLATION, DEFAULT_BATCH_SIZE, DEFAULT_METHOD, DEFAULT_METRIC,
                        DEFAULT_N_RANDOM, DEFAULT_N_STEPS, DEFAULT_PRUNE_REDUCE,
                        DEFAULT_REDUCE, DEFAULT_SEED)
from ..inputs.data import Dataset
from .clusters import CLUSTER_SOURCES
from ..errors import AttributionError
from ..engine.layers import LayerInfo, split_axis
from ..engine.processes import default_device
from .costs import CurveCost, CurvePlan, plan_curve
from .pruning_curves import ABLATIONS, METRICS, spaced_ks
from ..methods.passes import check_targets
from ..methods.registry import method_label
from ..methods.scores import (REDUCTIONS, check_reduce, cluster_codes, cluster_table,
                              find_cluster)

__all__ = [  # the defaults re-exported from attribution.defaults, and this module's own
    "DEFAULT_ABLATION", "DEFAULT_BATCH_SIZE", "DEFAULT_METHOD", "DEFAULT_METRIC",
    "DEFAULT_N_RANDOM", "DEFAULT_N_STEPS", "DEFAULT_PRUNE_REDUCE", "DEFAULT_REDUCE",
    "DEFAULT_SEED", "ORACLE_CHOICES", "PRUNE_ORACLE_SECONDS",
    "ABLATIONS", "METRICS", "REDUCTIONS", "CLUSTER_SOURCES",
    "DEFAULT_COMPARE", "DEFAULT_K", "K_RANGE", "BATCH_SIZES", "RANDOM_ORDERS",
    "REDUCE_CHOICES", "TARGETS", "ACTIVATION_KINDS", "EVIDENCE_METRIC", "EVIDENCE_CURVE_POINTS",
    "SCORECARD_METHODS", "BOOTSTRAP_DRAWS", "SCORECARD_N_RANDOM", "SCORECARD_CURVE_POINTS",
    "CURVE_K_STEPS", "PAGE_CURVE_SECONDS", "REDUCTION_LABELS", "METRIC_LABELS", "TARGET_LABELS",
    "CLUSTER_SOURCE_LABELS", "DEFAULT_CLUSTER_SOURCE", "DEFAULT_TARGET",
    "REGRESSION_SOURCE_LABELS", "REGRESSION_TARGET", "is_regression", "cluster_source_label",
    "target_label", "metric_choices", "default_metric", "metric_label",
    "cluster_source_choices", "default_cluster_source", "target_choices", "default_target",
    "default_device", "default_layer", "k_choices", "default_k", "evidence_ks",
    "partition_words", "class_label",
    "cluster_label", "curve_targets", "scoring_targets", "DataFacts", "Setting", "SETTINGS",
    "AnalysisSettings",
]

# ---------------------------------------------------------------- choices and their words

DEFAULT_COMPARE = ("gradient", "ablation")
"""Methods shown beside the main one (the dashboard's "Compare with", the report's)."""
TARGETS = ("true", "predicted", "fixed")
"""Which logit each sample is scored for: its true class, its predicted class, one class."""
ORACLE_CHOICES = ("auto", "on", "off")
"""Whether `prune` also measures exact ablation's k least important neurons: auto = when it
is estimated to take under PRUNE_ORACLE_SECONDS."""
PRUNE_ORACLE_SECONDS = 60.0
REDUCE_CHOICES = ("mean", "mean_abs")
"""The reductions the dashboard offers (the library and the command line also take "std")."""
DEFAULT_K = 8
"""k-means clusters when none is chosen."""
K_RANGE = (2, 20)
"""The smallest and largest k the dashboard offers (at most the number of samples)."""
BATCH_SIZES = (32, 64, 128, 256, 512, 1024)
"""The dashboard's batch sizes; DEFAULT_BATCH_SIZE is one of them."""
RANDOM_ORDERS = (5, 10, 20, 50, 100)
"""The dashboard's numbers of random orders; DEFAULT_N_RANDOM is one of them."""
ACTIVATION_KINDS = frozenset({"ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU",
                              "ReLU6", "Hardswish", "Mish", "SELU", "CELU", "PReLU", "RReLU",
                              "Softplus", "Hardtanh"})
"""Module types `default_layer` treats as a hidden activation."""
EVIDENCE_METRIC = "target_logit"
"""What the degeneracy check's pruning curve measures (not_better_than_random)."""
EVIDENCE_CURVE_POINTS = 32
"""k steps of that curve: every k up to 33 values, else 33 evenly spaced (`evidence_ks`)."""
SCORECARD_METHODS = ("gradient", "activation", "gradient_x_activation", "integrated_gradients",
                     "conductance", "ablation", "random")
"""The scorecard's methods when none are chosen: the seven that score any layer of a model
of float inputs without asking for its kind (weight_norm, bn_scale) or clusters (probe)."""
BOOTSTRAP_DRAWS = 1000
"""Bootstrap draws of every interval (the scorecard's spearman, the degeneracy checks'
agreement with ablation and cancellation): percentiles 2.5 and 97.5."""
SCORECARD_N_RANDOM = 10
"""Random orders of the scorecard's curve_area: only their mean area counts, not a band."""
SCORECARD_CURVE_POINTS = 8
"""k steps of the scorecard's curves: an area ratio needs the shape, not every k."""
CURVE_K_STEPS = 128  # pruning curves of wider layers use evenly spaced k (every k: minutes)
PAGE_CURVE_SECONDS = 120.0
"""The most the Pruning page's curves may take at their default size (`curve_plan`): they
are drawn as they compute and can be stopped, so a longer budget than an analysis's own
curve (`costs.CURVE_SECONDS`); and a budget far above a small layer's curve, so that a busy
machine's timing does not change its size."""
REDUCTION_LABELS = {"mean": "signed mean", "mean_abs": "mean |·|", "std": "std"}
METRIC_LABELS = {"accuracy": "accuracy", "target_logit": "target logit",
                 "loss": "cross-entropy loss", "squared_error": "squared error"}
TARGET_LABELS = {"true": "true class", "predicted": "predicted class", "fixed": "a fixed class"}
CLUSTER_SOURCE_LABELS = {
    "label": "true label", "predicted": "predicted label",
    "correctness": "correct vs misclassified", "provided": "provided cluster column",
    "kmeans_inputs": "k-means on the inputs", "kmeans_activations": "k-means on the layer",
}
"""How menus name each of CLUSTER_SOURCES (`partition_words` for a sentence)."""
_NEED_LABELS = ("label", "correctness")


REGRESSION_SOURCE_LABELS = {"label": "true value (quartiles)",
                            "predicted": "output (quartiles)"}
"""How menus name the label and prediction sources of a regression head (one output): the
samples grouped by quartile of their true value or of the model's output."""
REGRESSION_TARGET = "predicted"
"""A regression head's only target: its one output (None, as `scoring_targets` gives it)."""


def is_regression(n_outputs: int) -> bool:
    """A model with one output is a regression head: its score is the output itself, with
    no class; its labels are true values, grouped by quartile; its curves measure the
    output or the squared error (`metric_choices`)."""
    return n_outputs == 1


def cluster_source_choices(has_labels: bool, has_provided_clusters: bool, *,
                           regression: bool = False) -> tuple[str, ...]:
    """The cluster sources that data can use, in menu order (CLUSTER_SOURCES): without labels
    no "label" or "correctness", without a cluster column no "provided"; a regression head
    has no "correctness" (no class to be right about)."""
    return tuple(source for source in CLUSTER_SOURCES
                 if (has_labels or source not in _NEED_LABELS)
                 and (has_provided_clusters or source != "provided")
                 and not (regression and source == "correctness"))


def default_cluster_source(has_labels: bool, has_provided_clusters: bool) -> str:
    """The cluster source used when none is chosen: "label" for data with labels (for a
    regression head, the quartiles of the true value), else "provided" for data with a
    cluster column, else "predicted" (why: the module docstring)."""
    if has_labels:
        return "label"
    return "provided" if has_provided_clusters else "predicted"


def cluster_source_label(source: str, regression: bool = False) -> str:
    """How menus name a cluster source (CLUSTER_SOURCE_LABELS; REGRESSION_SOURCE_LABELS)."""
    if regression and source in REGRESSION_SOURCE_LABELS:
        return REGRESSION_SOURCE_LABELS[source]
    return CLUSTER_SOURCE_LABELS.get(source, source)


def target_choices(has_labels: bool, *, regression: bool = False) -> tuple[str, ...]:
    """The targets (TARGETS) data can be scored for: no "true" without labels; a regression
    head only its one output."""
    if regression:
        return (REGRESSION_TARGET,)
    return tuple(target for target in TARGETS if has_labels or target != "true")


def default_target(has_labels: bool, *, regression: bool = False) -> str:
    """The target used when none is chosen: "true" with labels, else "predicted" (for a
    regression head always its output)."""
    return "true" if has_labels and not regression else "predicted"


def target_label(target: str, regression: bool = False) -> str:
    """How menus name a target (TARGET_LABELS; a regression head's is "the output")."""
    return "the output" if regression else TARGET_LABELS.get(target, target)


def metric_choices(*, regression: bool = False, has_labels: bool = True) -> tuple[str, ...]:
    """The pruning-curve metrics (METRICS) a model and data can measure: a classifier's
    accuracy, target logit and loss; a regression head's output and, with true values, its
    squared error."""
    if regression:
        return ("target_logit",) + (("squared_error",) if has_labels else ())
    return tuple(metric for metric in METRICS if metric != "squared_error")


def default_metric(*, regression: bool = False, has_labels: bool = True) -> str:
    """The metric used when none is chosen: DEFAULT_METRIC (accuracy) for a classifier; the
    squared error for a regression head with true values, else its output."""
    if regression:
        return metric_choices(regression=True, has_labels=has_labels)[-1]
    return DEFAULT_METRIC


def metric_label(metric: str, regression: bool = False) -> str:
    """How menus and axes name a metric (METRIC_LABELS; a regression head's target logit is
    its output)."""
    if regression and metric == "target_logit":
        return "output"
    return METRIC_LABELS.get(metric, metric)


DEFAULT_CLUSTER_SOURCE = default_cluster_source(has_labels=True, has_provided_clusters=True)
"""`AnalysisSettings`' cluster source when none is given (that of labelled data)."""
DEFAULT_TARGET = default_target(has_labels=True)
"""`AnalysisSettings`' target when none is given (that of labelled data)."""


def default_layer(layers: Sequence[LayerInfo]) -> str:
    """The name of the layer analysed when none is chosen: the last hidden activation (a ReLU
    or similar, ACTIVATION_KINDS, before the output layer), else the layer before the output.

    Args:
        layers: the model's scorable layers in order (`list_layers`, `LoadedModel.layers()`).
    """
    hidden = list(layers[:-1]) or list(layers)
    activations = [info for info in hidden if info.kind in ACTIVATION_KINDS]
    return (activations or hidden)[-1].name


def k_choices(n_samples: int) -> tuple[int, ...]:
    """The k-means k the dashboard offers for data of `n_samples`: K_RANGE, at most
    n_samples (never fewer than the one choice k = 2)."""
    low, high = K_RANGE
    return tuple(range(low, max(low + 1, min(high + 1, n_samples + 1))))


def default_k(n_samples: int) -> int:
    """DEFAULT_K, or the largest of `k_choices` when the data has fewer samples."""
    return min(DEFAULT_K, k_choices(n_samples)[-1])


def evidence_ks(n_neurons: int) -> list[int]:
    """The k values of the degeneracy check's evidence curve (EVIDENCE_CURVE_POINTS)."""
    return spaced_ks(n_neurons, EVIDENCE_CURVE_POINTS)


def partition_words(source: str, k: Optional[int] = None, layer: Optional[str] = None,
                    regression: bool = False) -> str:
    """A partition of the samples in words, e.g. "true label", "k-means on the inputs (k = 8)",
    "k-means on layer relu2 (k = 8)" ("k-means on the layer" without `layer`)."""
    words = cluster_source_label(source, regression)
    if source == "kmeans_activations" and layer:
        words = f"k-means on layer {layer}"
    if source.startswith("kmeans") and k is not None:
        words += f" (k = {k})"
    return words


def class_label(class_id: int, class_names: Optional[Sequence[str]]) -> str:
    """e.g. "3 (three)" when the classes have names, else "3"."""
    if class_names is not None and 0 <= class_id < len(class_names):
        return f"{class_id} ({class_names[class_id]})"
    return str(class_id)


def cluster_label(cluster: object, source: str, class_names: Optional[Sequence[str]]) -> str:
    """How a cluster of the partition `source` is named: "3 (three)" for clusters that are
    classes with names, else the id itself."""
    if source in ("label", "predicted") and isinstance(cluster, (int, np.integer)):
        return class_label(int(cluster), class_names)
    return str(cluster)


def curve_targets(metric: str, labels: Optional[torch.Tensor],
                  scoring: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """What pruning curves measuring `metric` measure against: accuracy against the labels
    (against the unpruned model's predictions without labels), a regression head's squared
    error against its true values (the labels); the logit and the loss follow `scoring`,
    the targets the neurons were scored for."""
    return labels if metric in ("accuracy", "squared_error") else scoring


def scoring_targets(labels: Optional[torch.Tensor], n_samples: int, target: str,
                    fixed_class: int = 0, n_classes: Optional[int] = None
                    ) -> Optional[torch.Tensor]:
    """The logit each sample is scored for: LongTensor [n_samples], or None (the predicted
    class). `target` is "true" (the labels), "predicted" or "fixed" (`fixed_class`)."""
    if target == "predicted":
        return None
    if target == "true":
        if labels is None:
            raise AttributionError(
                "This data has no labels, so there is no true class to score: score the "
                "predicted class or a fixed class (command line: --targets predicted or a "
                "class id; .npy data takes its labels from --labels).")
        return labels
    if target == "fixed":
        return check_targets(torch.full((n_samples,), int(fixed_class), dtype=torch.long),
                             n_classes=n_classes, name="the fixed class")
    raise AttributionError(f"Unknown target {target!r}; use one of {', '.join(TARGETS)}.")


# ---------------------------------------------------------------- the table front ends draw

@dataclass(frozen=True)
class DataFacts:
    """What a model and its data decide about the settings' menus and defaults.

    Attributes:
        layers: the model's scorable layers in order (`list_layers`).
        has_labels: the data has true labels (or, for a regression head, true values).
        has_provided_clusters: the data has its own cluster column.
        n_samples: the number of samples (None: not known, e.g. not yet read).
        regression: the model has one output (`is_regression`).
    """

    layers: Sequence[LayerInfo] = ()
    has_labels: bool = True
    has_provided_clusters: bool = False
    n_samples: Optional[int] = None
    regression: bool = False


@dataclass(frozen=True)
class Setting:
    """One choice behind a view as every front end offers it: the command line's option
    (`cli_options.add_setting`) and the dashboard's widget (`pages.shared.sidebar.draw_setting`)
    are both made from it, so they share their name, meaning, values and default.

    Attributes:
        name: the `AnalysisSettings` field it sets ("neuron_axis": the layer's "name:axis").
        flag: the command line's option; None where the dashboard alone offers it.
        key: the dashboard's widget key (session state; the page address names it without
            its "w_"); None where the command line alone offers it.
        label: the widget's label.
        help: what it means, one sentence for the option's help and the widget's tooltip.
        widget: the Streamlit element that draws it ("selectbox", "radio", "select_slider",
            "multiselect").
        kind: how the command line reads it: "choice" (one of `choices`), "positive" (an
            integer of at least 1), "integer" or "text".
        choices: every value the command line accepts ("choice"), and the dashboard's menu
            unless `menu_for` narrows it to what the data offers.
        default: the default where the data does not decide it.
        default_for: the default the data decides (`DataFacts` -> value), said in
            `default_words` on the command line, which resolves it once the data is read.
        menu_for: the values this data offers (`DataFacts` -> tuple), a subset of `choices`.
        words: how a menu names a value (value, regression -> text); None: the value itself.
    """

    name: str
    flag: Optional[str]
    key: Optional[str]
    label: str
    help: str
    widget: str = "selectbox"
    kind: str = "choice"
    choices: Optional[tuple] = None
    default: Any = None
    default_for: Optional[Callable[[DataFacts], Any]] = None
    default_words: str = ""
    menu_for: Optional[Callable[[DataFacts], tuple]] = None
    words: Optional[Callable[[Any, bool], str]] = None

    def menu(self, facts: DataFacts) -> tuple:
        """The values this data offers, in menu order."""
        return tuple(self.menu_for(facts)) if self.menu_for else tuple(self.choices or ())

    def default_of(self, facts: DataFacts) -> Any:
        """The value used when none is chosen, for this data."""
        return self.default_for(facts) if self.default_for else self.default

    def word(self, value: Any, regression: bool = False) -> str:
        """How a menu names `value`."""
        return self.words(value, regression) if self.words else str(value)


SETTINGS = {setting.name: setting for setting in (
    Setting("layer", "--layer", "w_layer", "Layer",
            "The layer whose neurons are scored. A neuron is a unit of a Linear layer, a "
            "channel of a conv layer, or a feature of a layer applied at every position of a "
            "sequence (found from the data: its positions follow the input's length).",
            kind="text",
            default_for=lambda facts: default_layer(facts.layers),
            default_words="the last hidden activation",
            menu_for=lambda facts: tuple(info.name for info in facts.layers)),
    Setting("cluster_source", "--clusters", "w_cluster_by", "Clusters from",
            "How samples are grouped; scores are averaged within each cluster.",
            choices=CLUSTER_SOURCES,
            default_for=lambda facts: default_cluster_source(facts.has_labels,
                                                             facts.has_provided_clusters),
            default_words="the label when the data has labels, else the data's cluster ids, "
                          "else the predicted class",
            menu_for=lambda facts: cluster_source_choices(
                facts.has_labels, facts.has_provided_clusters, regression=facts.regression),
            words=lambda source, regression: cluster_source_label(source, regression)),
    Setting("k", "--k", "w_k", "Number of k-means clusters",
            "How many clusters k-means forms.", widget="select_slider", kind="positive",
            default=DEFAULT_K,
            default_for=lambda facts: (DEFAULT_K if facts.n_samples is None
                                       else default_k(facts.n_samples)),
            menu_for=lambda facts: k_choices(facts.n_samples or K_RANGE[1])),
    Setting("cluster", "--cluster", "w_cluster", "Cluster",
            "The cluster whose neurons are ranked and pruned.", kind="text"),
    Setting("method", "--method", "w_method", "Method",
            "How a neuron's importance for one sample is measured.", default=DEFAULT_METHOD,
            words=lambda method, _regression: method_label(method)),
    Setting("compare", None, "w_compare", "Compare with",
            "Methods shown beside the main one on the Scores page.", widget="multiselect",
            default=DEFAULT_COMPARE, words=lambda method, _regression: method_label(method)),
    Setting("reduce", "--reduce", "w_reduce", "Reduction over a cluster",
            "How a cluster's per-sample scores become one per neuron: the signed mean "
            "(positive and negative effects cancel) or the mean magnitude (mean |·|).",
            widget="radio", choices=REDUCTIONS, default=DEFAULT_REDUCE,
            menu_for=lambda facts: REDUCE_CHOICES,
            words=lambda reduce, _regression: REDUCTION_LABELS.get(reduce, reduce)),
    Setting("target", "--targets", "w_target", "Score the logit of the",
            "Which logit each sample is scored for. A model with one output (a regression "
            "head) has no classes: its score is the output itself.", widget="radio",
            choices=TARGETS,
            default_for=lambda facts: default_target(facts.has_labels,
                                                     regression=facts.regression),
            default_words="the true class when the data has labels, else the predicted one",
            menu_for=lambda facts: target_choices(facts.has_labels,
                                                  regression=facts.regression),
            words=lambda target, regression: target_label(target, regression)),
    Setting("fixed_class", None, "w_class", "Class", "The class every sample is scored for.",
            default=0),
    Setting("batch_size", "--batch-size", "w_batch", "Batch size",
            "Samples per pass; results do not depend on it, memory does.",
            widget="select_slider", kind="positive", choices=BATCH_SIZES,
            default=DEFAULT_BATCH_SIZE),
    Setting("metric", "--metric", "w_metric", "Measure", "What the pruning curves measure.",
            choices=METRICS,
            default_for=lambda facts: default_metric(regression=facts.regression,
                                                     has_labels=facts.has_labels),
            default_words=f"{DEFAULT_METRIC}; a regression head's squared_error, or "
                          "target_logit, its output, for data without true values",
            menu_for=lambda facts: metric_choices(regression=facts.regression,
                                                  has_labels=facts.has_labels),
            words=lambda metric, regression: metric_label(metric, regression)),
    Setting("n_random", "--n-random", "w_random", "Random orders",
            "Random orders of the neurons forming the pruning curves' band: more give a "
            "smoother band and take longer.",
            widget="select_slider", kind="positive", choices=RANDOM_ORDERS,
            default=DEFAULT_N_RANDOM),
    Setting("neuron_axis", "--neuron-axis", "w_axis", "Neurons along",
            "Which dim of the layer's output holds its neurons (dim 0 is the batch); the "
            "scores of the other dims' positions are pooled.", kind="integer",
            default_words="read from the data"),
    Setting("seed", "--seed", None, "Seed", "The seed of every random draw.",
            kind="integer", default=DEFAULT_SEED),
)}
"""Every setting a front end offers, by `AnalysisSettings` field."""


@dataclass(frozen=True)
class AnalysisSettings:
    """Every choice behind one view of the results (the dashboard's sidebar, the CLI's flags).

    Every field defaults to this module's default; `for_data` also picks the layer, cluster
    source and target that fit the data (those of labelled data otherwise).

    Attributes:
        layer: dotted layer name, or "name:axis" with the neuron axis chosen by hand
            (`layers.resolve_layer`; `LayerInfo.spec`).
        method: the main scoring method; `compare` adds methods shown beside it.
        cluster_source: one of `CLUSTER_SOURCES` (`attribution.analyses.clusters.make_clusters`).
        k: number of clusters for the k-means sources.
        cluster: the cluster in focus; None = the first cluster id (`with_cluster_of`).
        reduce: "mean" (signed) or "mean_abs".
        target: "true" (labels), "predicted" or "fixed" (`fixed_class` for every sample).
        metric: pruning-curve metric: "accuracy", "target_logit" or "loss"; for a regression
            head "target_logit" (its output) or "squared_error" (`metric_choices`).
        n_random: random orders forming the pruning curves' band.
    """

    layer: str
    method: str = DEFAULT_METHOD
    compare: tuple[str, ...] = DEFAULT_COMPARE
    cluster_source: str = DEFAULT_CLUSTER_SOURCE
    k: int = DEFAULT_K
    cluster: object = None
    reduce: str = DEFAULT_REDUCE
    target: str = DEFAULT_TARGET
    fixed_class: int = 0
    metric: str = DEFAULT_METRIC
    n_random: int = DEFAULT_N_RANDOM
    batch_size: int = DEFAULT_BATCH_SIZE
    seed: int = DEFAULT_SEED

    def __post_init__(self):
        check_reduce(self.reduce)
        if self.target not in TARGETS:
            raise AttributionError(f"Unknown target {self.target!r}; use one of "
                                   f"{', '.join(TARGETS)}.")

    @classmethod
    def for_data(cls, layers: Sequence[LayerInfo], *, has_labels: bool,
                 has_provided_clusters: bool, n_samples: Optional[int] = None,
                 regression: bool = False, **choices) -> "AnalysisSettings":
        """The settings a front end starts from for this model and data: every field's
        default in `SETTINGS` for these `DataFacts` (the layer, cluster source, target, metric
        and k the data decides); `regression` for a model with one output (`is_regression`);
        `choices` (any field, e.g. layer="fc2") replace them."""
        facts = DataFacts(tuple(layers), has_labels, has_provided_clusters, n_samples,
                          regression)
        fields = {field.name for field in dataclasses.fields(cls)}
        defaults = {name: setting.default_of(facts) for name, setting in SETTINGS.items()
                    if name in fields and setting.default_of(facts) is not None}
        return cls(**{**defaults, **choices})

    def layer_info(self, layers: Sequence[LayerInfo]) -> LayerInfo:
        """The `LayerInfo` of `layer` among `layers` (`list_layers`), with the neuron axis
        chosen in a "name:axis" layer; AttributionError for a layer not among them."""
        name, axis = split_axis(self.layer)
        info = next((info for info in layers if info.name == name), None)
        if info is None:
            raise AttributionError(f"Unknown layer {name!r}; layers: "
                                   f"{', '.join(info.name for info in layers)}.")
        return info if axis is None else info.with_axis(axis)

    @property
    def methods(self) -> tuple[str, ...]:
        """The main method first, then the compared ones (no repeats)."""
        return tuple(dict.fromkeys((self.method,) + tuple(self.compare)))

    # ------------------------------------------------------------ which samples, which logit

    def with_cluster_of(self, clusters: Sequence) -> "AnalysisSettings":
        """These settings with `cluster` one of the ids in `clusters` [N]: None becomes the
        first id, text matches an id that prints the same ("3" -> 3); else AttributionError."""
        ids = cluster_codes(clusters, None)[1]
        cluster = ids[0] if self.cluster is None else find_cluster(self.cluster, ids)
        return replace(self, cluster=cluster.item() if hasattr(cluster, "item") else cluster)

    def cluster_rows(self, clusters: Sequence) -> np.ndarray:
        """bool [N]: the samples of the cluster in focus."""
        return np.asarray(clusters) == self.cluster

    def targets(self, dataset: Dataset, n_classes: Optional[int] = None
                ) -> Optional[torch.Tensor]:
        """The logit each sample is scored for: LongTensor [N], or None (predicted class)."""
        return scoring_targets(dataset.labels, len(dataset), self.target, self.fixed_class,
                               n_classes)

    def curve_targets(self, labels: Optional[torch.Tensor],
                      scoring: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Targets of the pruning curves (`curve_targets` of `metric`)."""
        return curve_targets(self.metric, labels, scoring)

    # ------------------------------------------------------------ rankings and curves

    def ranking(self, per_sample: np.ndarray, clusters: Sequence) -> np.ndarray:
        """[n]: the focus cluster's `reduce` of the main method's per-sample scores [N, n]."""
        table = cluster_table(per_sample, np.asarray(clusters), self.reduce)
        return table.loc[self.cluster].drop("n").to_numpy()

    def curve_ks(self, n_neurons: int) -> list[int]:
        """The neuron counts k a pruning curve evaluates: every k up to CURVE_K_STEPS + 1
        values, else that many evenly spaced ones."""
        return spaced_ks(n_neurons, CURVE_K_STEPS)

    def curve_plan(self, cost: CurveCost, clusters: Sequence,
                   full: bool = False) -> CurvePlan:
        """The pruning curves' size from their cost (`view.curve_cost_on`): every one of
        `curve_ks` on every sample where they fit PAGE_CURVE_SECONDS less the seconds the
        estimate took (the wait is the budget's; always, with `full`); else fewer k, then
        a share of the focus cluster's and of the rest's samples (`costs.plan_curve`, the
        random orders kept)."""
        fixed = cost.seconds * cost.front_share
        per_mask = cost.seconds * (1 - cost.front_share) / max(cost.masks, 1)
        return plan_curve(fixed, per_mask, cost.n_neurons,
                          self.cluster_rows(clusters).astype(np.int64), self.n_random,
                          CURVE_K_STEPS, budget=math.inf if full else max(
                              PAGE_CURVE_SECONDS - cost.priced_in, 0.0),
                          seed=self.seed)

    # ------------------------------------------------------------ in words

    def describe(self, class_names: Optional[Sequence[str]] = None) -> dict[str, str]:
        """Label -> value, in words, for tables and reports."""
        target = TARGET_LABELS.get(self.target, self.target)
        if self.target == "fixed":
            target = f"class {class_label(self.fixed_class, class_names)}"
        source = partition_words(self.cluster_source, self.k, self.layer)
        return {
            "layer": self.layer, "clusters from": source,
            "cluster in focus": cluster_label(self.cluster, self.cluster_source, class_names),
            "method": method_label(self.method),
            "compared with": ", ".join(method_label(m) for m in self.methods[1:]) or "-",
            "reduction": REDUCTION_LABELS.get(self.reduce, self.reduce),
            "target logit": target, "pruning metric": self.metric,
            "random orders": str(self.n_random), "batch size": str(self.batch_size),
            "seed": str(self.seed),
        }

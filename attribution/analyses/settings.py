"""The settings behind one view of the results and every choice that follows from them.

The dashboard's pages, its HTML report and the command line all ask `AnalysisSettings` which
logit each sample is scored for, which cluster is in focus and which samples it holds, which
neuron counts k a pruning curve evaluates and how the curves are computed, so the same
settings can never give two answers.

    settings = AnalysisSettings(layer="relu2", cluster=3, target="fixed", fixed_class=3)
    settings = settings.with_cluster_of(clusters)       # a cluster that exists ("3" -> 3)
    targets = settings.targets(dataset, n_classes=10)   # LongTensor [N], or None = predicted
    focus = settings.cluster_rows(clusters)              # bool [N]
    ranking = settings.ranking(per_sample, clusters)     # [n] the focus cluster's scores
    curves = settings.pruning_curves(model, dataset, clusters, targets, ranking)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..inputs.data import Dataset
from ..errors import AttributionError
from ..engine.layers import LayerInfo, split_axis
from .pruning import cluster_pruning_curves, spaced_ks
from ..methods.passes import check_targets
from ..methods.registry import method_label
from ..methods.scores import check_reduce, cluster_codes, cluster_table, find_cluster

TARGETS = ("true", "predicted", "fixed")
CURVE_K_STEPS = 128  # pruning curves of wider layers use evenly spaced k (every k: minutes)
REDUCTION_LABELS = {"mean": "signed mean", "mean_abs": "mean |·|", "std": "std"}
METRIC_LABELS = {"accuracy": "accuracy", "target_logit": "target logit",
                 "loss": "cross-entropy loss"}
TARGET_LABELS = {"true": "true class", "predicted": "predicted class", "fixed": "a fixed class"}
CLUSTER_SOURCE_LABELS = {
    "label": "true label", "predicted": "predicted label",
    "correctness": "correct vs misclassified", "provided": "provided cluster column",
    "kmeans_inputs": "k-means on the inputs", "kmeans_activations": "k-means on the layer",
}


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


@dataclass(frozen=True)
class AnalysisSettings:
    """Every choice behind one view of the results (the dashboard's sidebar, the CLI's flags).

    Attributes:
        layer: dotted layer name, or "name:axis" with the neuron axis chosen by hand
            (`layers.resolve_layer`; `LayerInfo.spec`).
        method: the main scoring method; `compare` adds methods shown beside it.
        cluster_source: one of `CLUSTER_SOURCE_LABELS` (`attribution.inputs.data.make_clusters`).
        k: number of clusters for the k-means sources.
        cluster: the cluster in focus; None = the first cluster id (`with_cluster_of`).
        reduce: "mean" (signed) or "mean_abs".
        target: "true" (labels), "predicted" or "fixed" (`fixed_class` for every sample).
        metric: pruning-curve metric: "accuracy", "target_logit" or "loss".
        n_random: random orders forming the pruning curves' band.
    """

    layer: str
    method: str = "gradient_x_activation"
    compare: tuple[str, ...] = ()
    cluster_source: str = "label"
    k: int = 8
    cluster: object = None
    reduce: str = "mean"
    target: str = "true"
    fixed_class: int = 0
    metric: str = "accuracy"
    n_random: int = 20
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self):
        check_reduce(self.reduce)
        if self.target not in TARGETS:
            raise AttributionError(f"Unknown target {self.target!r}; use one of "
                                   f"{', '.join(TARGETS)}.")

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
        """Targets of the pruning curves: accuracy is measured against the labels (against
        the unpruned model's predictions without labels); logit and loss follow `scoring`."""
        return labels if self.metric == "accuracy" else scoring

    # ------------------------------------------------------------ rankings and curves

    def ranking(self, per_sample: np.ndarray, clusters: Sequence) -> np.ndarray:
        """[n]: the focus cluster's `reduce` of the main method's per-sample scores [N, n]."""
        table = cluster_table(per_sample, np.asarray(clusters), self.reduce)
        return table.loc[self.cluster].drop("n").to_numpy()

    def curve_ks(self, n_neurons: int) -> list[int]:
        """The neuron counts k a pruning curve evaluates: every k up to CURVE_K_STEPS + 1
        values, else that many evenly spaced ones."""
        return spaced_ks(n_neurons, CURVE_K_STEPS)

    def pruning_curves(self, model: nn.Module, dataset: Dataset, clusters: Sequence,
                       targets: Optional[torch.Tensor], ranking: np.ndarray,
                       **run) -> pd.DataFrame:
        """`cluster_pruning_curves` of the focus cluster against the rest of the data.

        Args:
            targets: the scoring targets (`targets`), LongTensor [N] or None.
            ranking: [n] the scores that order the neurons (`ranking`).
            run: passed through: progress=, resume=, device=.
        """
        return cluster_pruning_curves(
            model, self.layer, dataset.inputs, self.curve_targets(dataset.labels, targets),
            clusters, self.cluster, ranking, ks=self.curve_ks(len(ranking)),
            n_random=self.n_random, seed=self.seed, metric=self.metric,
            batch_size=self.batch_size, **run)

    # ------------------------------------------------------------ in words

    def describe(self, class_names: Optional[Sequence[str]] = None) -> dict[str, str]:
        """Label -> value, in words, for tables and reports."""
        target = TARGET_LABELS.get(self.target, self.target)
        if self.target == "fixed":
            target = f"class {class_label(self.fixed_class, class_names)}"
        source = CLUSTER_SOURCE_LABELS.get(self.cluster_source, self.cluster_source)
        if self.cluster_source.startswith("kmeans"):
            source += f" (k = {self.k})"
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

"""Predictions and clusters: what the model predicts for each sample (`predictions`,
`predict_classes`), a layer's activations, and the cluster ids a view groups samples by
(`make_clusters`: the data's own column, the true or predicted class, correct vs.
misclassified, or k-means on the inputs or the layer's activations).

Shapes: N samples; ids [N] (int64, or strings for the data's string ids and correctness).
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_SEED
from ..engine import model_io
from ..engine.layers import run_logits
from ..errors import AttributionError
from ..inputs.data import Dataset, StreamedData
from ..inputs.loaded import LoadedModel
from ..methods.passes import LayerPass
from ..methods.scores import Progress, neuron_scores

KMEANS_RUNS = 4
"""k-means runs from different seeds; the clustering with the lowest inertia is kept."""
ACTIVATIONS_SHARE = 0.5
"""Share of k-means on activations that `make_clusters` reports for the activation pass."""
CLUSTER_SOURCES = ("label", "predicted", "correctness", "provided", "kmeans_inputs",
                   "kmeans_activations")
"""How `make_clusters` can group samples, in the order menus list them (the default, and the
choices a given data set allows, are decided in `attribution.analyses.settings`)."""
_IN_MEMORY_SOURCES = ("kmeans_inputs", "kmeans_activations")  # k-means reads every sample


def _module(model: Union[LoadedModel, nn.Module, None], source: str) -> nn.Module:
    if model is None:
        raise AttributionError(f"Cluster source {source!r} needs the model.")
    return model.module if isinstance(model, LoadedModel) else model


def predict_classes(model: Union[LoadedModel, nn.Module], inputs, *,
                    batch_size: int = DEFAULT_BATCH_SIZE,
                    progress: Progress = None) -> torch.Tensor:
    """Predicted class ids, int64 [N], for inputs [N, ...] or an iterable of batches such as
    `NpyRows` (eval mode, no grad, batched); `progress(fraction)` after each batch (NaN for
    an iterable of unknown length)."""
    module = _module(model, "predicted")
    layer_pass = LayerPass(module, None, inputs, batch_size=batch_size, grad=False,
                           what="predict")
    return torch.cat([predicted for _, predicted in layer_pass.run(
        lambda batch: run_logits(module, batch.x).argmax(dim=1).cpu(), progress)])


def predictions(model: Union[LoadedModel, nn.Module], inputs, *,
                batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress = None) -> torch.Tensor:
    """What the model predicts for each sample, as `predict_classes` runs it: int64 class
    ids [N] for a classifier, float32 output values [N] for a regression head (one output)."""
    module = _module(model, "predicted")
    layer_pass = LayerPass(module, None, inputs, batch_size=batch_size, grad=False,
                           what="predict")

    def predict(batch) -> torch.Tensor:
        logits = run_logits(module, batch.x)
        return (logits[:, 0].float() if logits.shape[1] == 1 else logits.argmax(dim=1)).cpu()
    return torch.cat([predicted for _, predicted in layer_pass.run(predict, progress)])


def layer_activations(model: Union[LoadedModel, nn.Module], layer: str, inputs: torch.Tensor,
                      *, batch_size: int = DEFAULT_BATCH_SIZE,
                      progress: Progress = None) -> torch.Tensor:
    """A layer's output per neuron, float32 [N, n]; conv channels are averaged over space
    (the engine's `activation` score). `progress(fraction)` after each batch."""
    return neuron_scores(_module(model, "kmeans_activations"), layer, inputs,
                         method="activation", batch_size=batch_size, progress=progress)


def make_clusters(source: str, dataset: Union[Dataset, StreamedData],
                  model: Union[LoadedModel, nn.Module, None] = None,
                  layer: Optional[str] = None, k: Optional[int] = None, seed: int = DEFAULT_SEED, *,
                  batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress = None) -> np.ndarray:
    """One cluster id per sample, [N].

    Args:
        source: "provided" (the data's cluster column/array), "label" (true class id),
            "predicted" (predicted class id), "correctness" ("correct"/"misclassified"),
            "kmeans_inputs" or "kmeans_activations" (ids 0..k-1; the latter on `layer`'s
            outputs, conv channels averaged over space).
        dataset: the samples (after `check_data` when a model is involved), or
            `StreamedData` for samples read batch by batch (every source but k-means, which
            needs them in memory).
        model: needed for "predicted", "correctness" and "kmeans_activations".
        layer: dotted layer name for "kmeans_activations".
        k: number of k-means clusters, 2..N.
        seed: k-means seed; the same seed gives the same clusters.
        progress: called with the fraction done after each batch of the model's passes and
            each k-means run (of `KMEANS_RUNS`); None for sources that compute nothing.
    Returns:
        np.ndarray [N]: int64 ids, or strings for "provided" string ids and "correctness".
    """
    if source not in CLUSTER_SOURCES:
        raise AttributionError(f"Unknown cluster source {source!r}; use one of "
                               f"{', '.join(CLUSTER_SOURCES)}.")
    if isinstance(dataset, StreamedData) and source in _IN_MEMORY_SOURCES:
        raise AttributionError(f"Cluster source {source!r} needs the data in memory (k-means "
                               "reads every sample at once), but these samples are read batch "
                               "by batch; load them in memory or pass precomputed cluster ids.")
    if source == "provided":
        if dataset.clusters is None:
            raise AttributionError("This data has no cluster ids; add a 'cluster' column/array "
                                   "or choose another cluster source.")
        return dataset.clusters
    if source in ("label", "correctness") and dataset.labels is None:
        raise AttributionError(f"Cluster source {source!r} needs labels; this data has none.")
    if source == "label":
        if dataset.labels.is_floating_point():  # a regression head's true values
            return quartiles(dataset.labels.numpy())
        return dataset.labels.numpy().copy()
    if source in ("predicted", "correctness"):
        predicted = predictions(_module(model, source), dataset.inputs, batch_size=batch_size,
                                progress=progress)
        if predicted.is_floating_point() and source == "correctness":
            raise AttributionError("A regression head (one output) has no class to be right "
                                   "or wrong about: group its samples by the quartile of their "
                                   "true value ('label') or of its output ('predicted').")
        if predicted.is_floating_point():  # a regression head: the quartiles of its output
            return quartiles(predicted.numpy())
        if source == "predicted":
            return predicted.numpy()
        return np.where((predicted == dataset.labels).numpy(), "correct", "misclassified")
    if source == "kmeans_activations":
        if layer is None:
            raise AttributionError("k-means on activations needs a layer; pick one from "
                                   "list_layers().")
        points = layer_activations(
            _module(model, source), layer, dataset.inputs, batch_size=batch_size,
            progress=None if progress is None else lambda f: progress(ACTIVATIONS_SHARE * f))
        done = ACTIVATIONS_SHARE
    else:
        points, done = model_io.flat(dataset.inputs), 0.0
    return _kmeans(points.double().numpy(), k, seed, None if progress is None else
                   lambda f: progress(done + (1.0 - done) * f))


QUARTILES = ("Q1 (lowest)", "Q2", "Q3", "Q4 (highest)")
"""The cluster ids of a regression head's samples grouped by value (`quartiles`)."""


def quartiles(values: np.ndarray) -> np.ndarray:
    """The quartile of each value [N] as its cluster id (QUARTILES), cut at the 25th, 50th
    and 75th percentiles; equal values share a quartile, so one repeated value empties some."""
    values = np.asarray(values, dtype=np.float64)
    edges = np.quantile(values, [0.25, 0.5, 0.75])
    return np.asarray(QUARTILES, dtype=object)[np.searchsorted(edges, values, side="left")]


def _kmeans(points: np.ndarray, k: Optional[int], seed: int,
            progress: Progress = None) -> np.ndarray:
    """Cluster ids int64 [N] of points [N, d]: the best of KMEANS_RUNS k-means runs, each
    seeded from `seed`; `progress(fraction)` after each run."""
    from sklearn.cluster import KMeans

    n = points.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= k <= n:
        raise AttributionError(f"k-means needs an integer k from 2 to the number of samples "
                               f"({n}); got {k!r}.")
    distinct = len(np.unique(points, axis=0))
    if distinct < 2:
        raise AttributionError("k-means cannot split these samples: they are all identical "
                               "(here). Choose another cluster source.")
    if distinct < k:
        raise AttributionError(f"k-means cannot make {k} clusters: there are only {distinct} "
                               f"distinct samples; choose k <= {distinct}.")
    best = None
    for run, run_seed in enumerate(np.random.RandomState(seed).randint(2 ** 31 - 1,
                                                                       size=KMEANS_RUNS)):
        fit = KMeans(n_clusters=int(k), n_init=1, random_state=int(run_seed)).fit(points)
        if best is None or fit.inertia_ < best.inertia_:
            best = fit
        if progress is not None:
            progress((run + 1) / KMEANS_RUNS)
    return best.labels_.astype(np.int64)

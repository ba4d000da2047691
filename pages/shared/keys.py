"""Cache keys: the strings and tuples that stand for what a cached result was computed from.

The cached functions take their large arguments (model, inputs, targets) with a leading
underscore, which st.cache_data does not hash; the keys built here, passed beside them,
identify those contents. No streamlit here: the keys are plain values, tested directly.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # only for the annotations: importing it loads torch
    from attribution.analyses.settings import AnalysisSettings


def digest(*parts: Optional[bytes]) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(b"-" if part is None else hashlib.sha256(part).digest())
    return hasher.hexdigest()[:16]


def demo_key(name: str) -> str:
    """The workspace key of a built-in demo."""
    return f"demo:{name}"


def upload_model_key(model: bytes, architecture: Optional[bytes]) -> str:
    """The key of an uploaded model (its weights and architecture files)."""
    return "model:" + digest(model, architecture)


def upload_key(model: bytes, architecture: Optional[bytes], data: bytes,
               image_shape: str = "") -> str:
    """The workspace key of an upload: the model's files, the data file and the image shape
    its samples are drawn in."""
    return "upload:" + digest(model, architecture, data, image_shape.encode())


def target_key(settings: AnalysisSettings) -> str:
    """Which logit each sample is scored for ("true", "predicted", "fixed:3")."""
    return f"fixed:{settings.fixed_class}" if settings.target == "fixed" \
        else settings.target


def cluster_key(settings: AnalysisSettings) -> str:
    """The cluster in focus and the partition it belongs to."""
    s = settings
    return f"{s.cluster_source}:{s.k}:{s.layer}:{s.cluster}"


def partition_key(settings: AnalysisSettings) -> str:
    """The grouping of the samples into clusters (not which one is in focus): its source,
    with k for k-means and the layer for k-means on the layer's activations."""
    s = settings
    k = s.k if s.cluster_source.startswith("kmeans") else ""
    layer = s.layer if s.cluster_source == "kmeans_activations" else ""
    return f"{s.cluster_source}:{k}:{layer}"


def curve_key(workspace_key: str, settings: AnalysisSettings) -> tuple:
    """Everything a pruning curve of the cluster in focus is computed from."""
    s = settings
    return (workspace_key, s.layer, s.method, target_key(s), cluster_key(s), s.reduce,
            s.metric, s.n_random, s.batch_size)

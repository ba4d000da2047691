"""The model and data in use (`Workspace`): a built-in demo or an upload, loaded and cached,
and the results that depend on nothing else (clusters, predictions).

The model is cached with st.cache_resource: one object shared by every session, which nothing
here mutates (the engine leaves it exactly as it found it, also when a rerun interrupts it).
Results are cached with st.cache_data; arguments with a leading underscore are not hashed,
and the keys next to them (`keys`) identify their contents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import streamlit as st
import torch

import attribution as at
from attribution.analyses import settings as analysis
from attribution.analyses import clusters
from attribution.analyses.settings import DataFacts, is_regression
from attribution.inputs.data import Dataset, check_data
from attribution.inputs.data_files import load_data
from attribution.inputs import model_formats
from attribution.inputs.demo import load_demo
from attribution.inputs.loaded import LoadedModel
from attribution.inputs.model_formats import load_model
from attribution.inputs.shipped import DEMO_DIR
from pages.shared.keys import demo_key, upload_key, upload_model_key
from pages.shared.progress import ProgressLine
from pages.shared.startup import TRUST_CODE

DEMO_TITLES = {"digits_mlp": "Demo: digits MLP", "digits_cnn": "Demo: digits CNN",
               "sanity": "Demo: three-branch sanity model",
               "text": "Demo: BERT on generated reviews"}
FAST_DEMOS = {  # demo -> (state dict, architecture, data) in demo/, equal to load_demo's
    "digits_mlp": ("digits_mlp_state_dict.pt", "digits_mlp_architecture.json", "digits.npz"),
    "digits_cnn": ("digits_cnn_state_dict.safetensors", "digits_cnn_architecture.yaml",
                   "digits_images.npz"),
}
UPLOAD = "upload"


@dataclass(frozen=True)
class Upload:
    """Files a user uploaded that loaded without error (kept in session state)."""

    model_name: str
    model: bytes
    architecture_name: Optional[str]
    architecture: Optional[bytes]
    data_name: str
    data: bytes
    image_shape: str = ""  # "8x8": each sample drawn as an image of that shape; "": as it is

    @property
    def model_key(self) -> str:
        return upload_model_key(self.model, self.architecture)

    @property
    def key(self) -> str:
        return upload_key(self.model, self.architecture, self.data, self.image_shape)


@dataclass(frozen=True)
class Workspace:
    """The model and data in use. `key` identifies both in cache keys."""

    key: str
    title: str
    loaded: LoadedModel
    data: Dataset
    layers: tuple

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.module

    @property
    def class_names(self) -> Optional[tuple[str, ...]]:
        return self.data.class_names or self.loaded.class_names

    @property
    def facts(self) -> DataFacts:
        """What this model and data decide about the settings' menus and defaults."""
        return DataFacts(self.layers, self.data.labels is not None,
                         self.data.clusters is not None, len(self.data),
                         is_regression(self.loaded.n_classes))


@st.cache_resource(max_entries=4, show_spinner="Loading the demo model…")
def _demo(name: str) -> tuple[LoadedModel, Dataset]:
    """The demo's model and data. The digits demos open from their state dict + architecture
    files (the same weights as the .pt2, written by scripts/make_demo.py): torch.export's
    loader imports about 3 s of torch internals on first use, too slow for a first page."""
    if name not in FAST_DEMOS:
        loaded, data = load_demo(name)
        return _on_compute_device(loaded), data
    weights, architecture, data = (DEMO_DIR / file for file in FAST_DEMOS[name])
    loaded = _on_compute_device(load_model(weights, architecture=architecture, sandbox=False))
    return loaded, check_data(load_data(data, sandbox=False), loaded)  # shipped: trusted


@st.cache_resource(max_entries=4, show_spinner="Reading the model…")
def _uploaded_model(model_key: str, trust_code: bool, _model: bytes,
                    _architecture: Optional[bytes]) -> LoadedModel:
    return _on_compute_device(load_model(_model, architecture=_architecture,
                                         trust_code=trust_code))


def _on_compute_device(loaded: LoadedModel) -> LoadedModel:
    """The loaded model moved to `settings.default_device()` (a GPU when one is present)
    before it is cached: every computation then runs there, its batches moved by the engine."""
    loaded.module.to(analysis.default_device())
    return loaded


@st.cache_data(max_entries=4, show_spinner="Reading the data…")
def _uploaded_data(key: str, _data: bytes, _loaded: LoadedModel, image_shape: str) -> Dataset:
    return check_data(load_data(_data, tokenizer=_loaded.tokenizer,
                                image_shape=image_shape or None,
                                input_names=_loaded.input_names), _loaded)


@st.cache_data(max_entries=8, show_spinner=False)
def _layers(key: str, _loaded: LoadedModel, _data: Dataset) -> tuple:
    """The model's layers as the data meets them (a text's positions are its tokens)."""
    return tuple(_loaded.layers(_data.inputs[:2]))


def validate_upload(upload: Upload) -> Workspace:
    """Load the uploaded files as the app will; raises AttributionError for a bad file, also
    for a failure no check anticipated, so the page records it and does not retry it on every
    rerun."""
    try:
        return workspace_of(UPLOAD, upload)
    except at.AttributionError:
        raise
    except Exception as error:  # noqa: BLE001 (an upload is refused, never a crash)
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise at.AttributionError(
            f"These files could not be read ({type(error).__name__}"
            + (f": {detail}" if detail else "") + "). Check that they are a model and data "
            "this app accepts (see the sample files below).") from error


def workspace_of(source: str, upload: Optional[Upload]) -> Workspace:
    if source == UPLOAD and upload is not None:
        loaded = _uploaded_model(upload.model_key, TRUST_CODE, upload.model, upload.architecture)
        data = _uploaded_data(upload.key, upload.data, loaded, upload.image_shape)
        key, title = upload.key, f"{upload.model_name} + {upload.data_name}"
    else:
        loaded, data = _demo(source)
        key, title = demo_key(source), DEMO_TITLES.get(source, source)
    layers = _layers(key, loaded, data)
    if not layers:
        raise at.AttributionError("This model has no layer with a neuron axis to score.")
    return Workspace(key, title, loaded, data, layers)


def warm_up() -> None:
    """Start the checker of uploaded models (a child process) while files are chosen."""
    model_formats.warm_up()


@st.cache_data(max_entries=16, show_spinner="Grouping samples into clusters…")
def cluster_ids(key: str, source: str, k: int, layer: str, batch_size: int,
                _loaded: LoadedModel, _data: Dataset, _progress) -> np.ndarray:
    with _progress:
        return clusters.make_clusters(source, _data, _loaded, layer or None, k,
                                      batch_size=batch_size, progress=_progress)


@st.cache_data(max_entries=8, show_spinner=False)
def _predictions(key: str, _loaded: LoadedModel, _data: Dataset, _progress) -> np.ndarray:
    with _progress:
        return clusters.predictions(_loaded, _data.inputs, progress=_progress).numpy()


def predictions(ws: Workspace) -> np.ndarray:
    """The model's predicted class of every sample [N] (a regression head's predicted value)
    (cached)."""
    return _predictions(ws.key, ws.loaded, ws.data,
                        ProgressLine("Predicting every sample's class"))

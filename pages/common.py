"""Streamlit glue shared by the pages: the model and data in use, the sidebar choices (kept
in session state and mirrored in the URL) and cached calls into `attribution`.

The model is cached with st.cache_resource: one object shared by every session, which nothing
here mutates (the engine leaves it exactly as it found it, also when a rerun interrupts it).
Results are cached with st.cache_data, keyed by (workspace, layer, method, target, clusters,
settings); arguments with a leading underscore are not hashed, and the string keys next to
them identify their contents. Pages only draw; every computation is a call into `attribution`.
"""
from __future__ import annotations

import base64
import gc
import hashlib
import math
import os
import re
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st
import torch

import attribution as at
from attribution import plots
from attribution.data import Dataset, check_data, load_data, make_clusters, predict_classes
from attribution.demo import DEMO_DIR, DEMOS, load_demo
from attribution.loading import LoadedModel, load_model
from attribution.progress import TimeLeft
from attribution.analysis import (CLUSTER_SOURCE_LABELS, TARGET_LABELS, AnalysisSettings,
                                  cluster_label)
from attribution.verdict import cluster_composition, describe_mix

# The ~290k objects of the imports above (torch, pandas, plotly) live as long as the server.
# Streamlit collects garbage fully after every run (runner.postScriptGC): ~70 ms walking them,
# holding the GIL while the run's last messages wait to be sent. Frozen, they are skipped.
gc.collect()  # nothing unreachable is frozen
gc.freeze()

TRUST_CODE = "--trust-code" in sys.argv[1:] or os.environ.get("ATTRIBUTION_TRUST_CODE") == "1"
"""Start-up setting (`streamlit run app.py -- --trust-code`): lets uploads run code. Only for
one's own files on one's own machine; never a widget."""
DEMO_TITLES = {"digits_mlp": "Demo: digits MLP", "digits_cnn": "Demo: digits CNN",
               "sanity": "Demo: three-branch sanity model",
               "text": "Demo: BERT on generated reviews"}
FAST_DEMOS = {  # demo -> (state dict, architecture, data) in demo/, equal to load_demo's
    "digits_mlp": ("digits_mlp_state_dict.pt", "digits_mlp_architecture.json", "digits.npz"),
    "digits_cnn": ("digits_cnn_state_dict.safetensors", "digits_cnn_architecture.yaml",
                   "digits_images.npz"),
}
UPLOAD = "upload"
BATCH_SIZES = (32, 64, 128, 256, 512, 1024)
RANDOM_ORDERS = (5, 10, 20, 50, 100)
METRIC_LABELS = plots.METRIC_LABELS  # the Pruning page's Measure box
DEFAULT_METHOD, DEFAULT_COMPARE = "gradient_x_activation", ("gradient", "ablation")
_ACTIVATION_KINDS = {"ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU"}
# session-state key -> URL parameter, for every choice a shared link reproduces
URL_KEYS = {"w_source": "source", "w_layer": "layer", "w_cluster_by": "cluster_by",
            "w_k": "k", "w_cluster": "cluster", "w_method": "method", "w_compare": "compare",
            "w_reduce": "reduce", "w_target": "target", "w_class": "class",
            "w_batch": "batch", "w_metric": "metric", "w_random": "random",
            "w_neuron": "neuron", "w_axis": "axis"}
CHOICE_KEYS = {"reduce": "w_reduce", "method": "w_method", "cluster_source": "w_cluster_by"}
"""`attribution.verdict.Remedy.choice` -> the sidebar widget it changes (`apply_choice`)."""
NEURON_CHOICE = "neuron_choice"  # session state: the neuron the Neuron page opens
NEURON_PAGE = "pages/neuron.py"
_PAGE_KEYS = {  # widgets that live on one page: (default, options)
    "w_metric": ("accuracy", tuple(METRIC_LABELS)), "w_random": (20, RANDOM_ORDERS)}


def escape_markdown(text: object) -> str:
    """A user-supplied string made inert for st.markdown (no links, images or formatting)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$:])", r"\\\1", str(text))


def digest(*parts: Optional[bytes]) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(b"-" if part is None else hashlib.sha256(part).digest())
    return hasher.hexdigest()[:16]


# ------------------------------------------------------------------ model and data

@dataclass(frozen=True)
class Upload:
    """Files a user uploaded that loaded without error (kept in session state)."""

    model_name: str
    model: bytes
    architecture_name: Optional[str]
    architecture: Optional[bytes]
    data_name: str
    data: bytes

    @property
    def model_key(self) -> str:
        return "model:" + digest(self.model, self.architecture)

    @property
    def key(self) -> str:
        return "upload:" + digest(self.model, self.architecture, self.data)


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


@st.cache_resource(max_entries=4, show_spinner="Loading the demo model…")
def _demo(name: str) -> tuple[LoadedModel, Dataset]:
    """The demo's model and data. The digits demos open from their state dict + architecture
    files (the same weights as the .pt2, written by scripts/make_demo.py): torch.export's
    loader imports about 3 s of torch internals on first use, too slow for a first page."""
    if name not in FAST_DEMOS:
        return load_demo(name)
    weights, architecture, data = (DEMO_DIR / file for file in FAST_DEMOS[name])
    loaded = load_model(weights, architecture=architecture)
    return loaded, check_data(load_data(data), loaded)


@st.cache_resource(max_entries=4, show_spinner="Reading the model…")
def _uploaded_model(model_key: str, trust_code: bool, _model: bytes,
                    _architecture: Optional[bytes]) -> LoadedModel:
    return load_model(_model, architecture=_architecture, trust_code=trust_code)


@st.cache_data(max_entries=4, show_spinner="Reading the data…")
def _uploaded_data(key: str, _data: bytes, _loaded: LoadedModel) -> Dataset:
    return check_data(load_data(_data, tokenizer=_loaded.tokenizer), _loaded)


@st.cache_data(max_entries=8, show_spinner=False)
def _layers(key: str, _loaded: LoadedModel) -> tuple:
    return tuple(_loaded.layers())


def validate_upload(upload: Upload) -> Workspace:
    """Load the uploaded files as the app will; raises AttributionError for a bad file, also
    for a failure no check anticipated, so the page records it and does not retry it on every
    rerun."""
    try:
        return _workspace_of(UPLOAD, upload)
    except at.AttributionError:
        raise
    except Exception as error:  # noqa: BLE001 (an upload is refused, never a crash)
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise at.AttributionError(
            f"These files could not be read ({type(error).__name__}"
            + (f": {detail}" if detail else "") + "). Check that they are a model and data "
            "this app accepts (see the sample files below).") from error


def _workspace_of(source: str, upload: Optional[Upload]) -> Workspace:
    if source == UPLOAD and upload is not None:
        loaded = _uploaded_model(upload.model_key, TRUST_CODE, upload.model, upload.architecture)
        data = _uploaded_data(upload.key, upload.data, loaded)
        key, title = upload.key, f"{upload.model_name} + {upload.data_name}"
    else:
        loaded, data = _demo(source)
        key, title = f"demo:{source}", DEMO_TITLES.get(source, source)
    layers = _layers(key, loaded)
    if not layers:
        raise at.AttributionError("This model has no layer with a neuron axis to score.")
    return Workspace(key, title, loaded, data, layers)


def default_layer(layers: Sequence[at.LayerInfo]) -> str:
    """The last hidden activation (a ReLU or similar before the output), else the layer
    before the output."""
    hidden = list(layers[:-1]) or list(layers)
    activations = [info for info in hidden if info.kind in _ACTIVATION_KINDS]
    return (activations or hidden)[-1].name


# ------------------------------------------------------------------ cached results

class ProgressLine:
    """A library `progress=` callback that draws "what: 40% done · about 12 s left", only once
    the estimate (`TimeLeft`, from the first batch) exceeds SAY_ABOVE_SECONDS: fast work shows
    nothing. It creates its line where it is first called and removes it at fraction 1.0 or on
    leaving `with line:`. Inside an `st.cache_data` function enter it there (one line per
    call): the cache then records the line's removal too, and a hit replays a line that is gone
    (a line drawn before the call could not be replayed at all)."""

    REDRAW_SECONDS = 0.2  # at most this often: each draw is also kept for the cache's replay

    def __init__(self, what: str):
        self.what, self.time_left, self.bar, self.drawn_at = what, TimeLeft(), None, 0.0

    def __call__(self, fraction: float, *_) -> None:
        if not math.isfinite(fraction):  # work of unknown length: nothing to estimate
            return
        if fraction >= 1.0:
            self.close()
            return
        estimate, now = self.time_left.words(fraction), time.monotonic()
        if (self.bar is None and not estimate) or now - self.drawn_at < self.REDRAW_SECONDS:
            return
        text = f"{self.what}: {fraction:.0%} done" + (f" · {estimate}" if estimate else "")
        if self.bar is None:
            self.bar = st.progress(fraction, text=text)
        else:
            self.bar.progress(fraction, text=text)
        self.drawn_at = now

    def close(self) -> None:
        """Remove the line (the work ended, or failed)."""
        if self.bar is not None:
            self.bar.empty()
            self.bar = None

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *_) -> None:
        self.close()  # a failed computation leaves no line behind


@st.cache_data(max_entries=64, show_spinner="Scoring neurons…")
def _per_sample(key: str, layer: str, method: str, target_key: str, batch_size: int,
                _model, _inputs: torch.Tensor, _targets: Optional[torch.Tensor],
                _progress) -> np.ndarray:
    with _progress:
        return at.neuron_scores(_model, layer, _inputs, _targets, method,
                                batch_size=batch_size, progress=_progress).numpy()


@st.cache_data(max_entries=16, show_spinner="Grouping samples into clusters…")
def _clusters(key: str, source: str, k: int, layer: str, batch_size: int,
              _loaded: LoadedModel, _data: Dataset, _progress) -> np.ndarray:
    with _progress:
        return make_clusters(source, _data, _loaded, layer or None, k, batch_size=batch_size,
                             progress=_progress)


@st.cache_data(max_entries=8, show_spinner=False)
def _predictions(key: str, _loaded: LoadedModel, _data: Dataset, _progress) -> np.ndarray:
    with _progress:
        return predict_classes(_loaded, _data.inputs, progress=_progress).numpy()


def predictions(ws: Workspace) -> np.ndarray:
    """The model's predicted class of every sample [N] (cached)."""
    return _predictions(ws.key, ws.loaded, ws.data,
                        ProgressLine("Predicting every sample's class"))


@st.cache_data(max_entries=16, show_spinner="Running the degeneracy checks…")
def _findings(key: str, layer: str, method: str, target_key: str, cluster_key: str,
              reduce: str, batch_size: int, user_key: str, _model, _inputs, _targets,
              _user_scores, _progress) -> list:
    with _progress:
        return at.diagnose(_model, layer, _inputs, _targets, method, reduce=reduce,
                           user_scores=_user_scores, batch_size=batch_size, progress=_progress)


@st.cache_data(max_entries=16, show_spinner="Comparing every method with exact ablation…")
def _oracle(key: str, layer: str, methods: tuple, target_key: str, cluster_key: str,
            reduce: str, batch_size: int, _model, _inputs, _targets, _progress):
    with _progress:
        table = at.oracle_agreement(_model, layer, _inputs, _targets, methods=methods,
                                    reduce=reduce, batch_size=batch_size, progress=_progress)
    return table.drop(columns="cluster")


@dataclass(frozen=True)
class Context:
    """What every page works on: the workspace, the choices, and the clusters they imply."""

    ws: Workspace
    settings: AnalysisSettings
    clusters: np.ndarray
    targets: Optional[torch.Tensor]

    @property
    def target_key(self) -> str:
        return f"fixed:{self.settings.fixed_class}" if self.settings.target == "fixed" \
            else self.settings.target

    @property
    def cluster_key(self) -> str:
        s = self.settings
        return f"{s.cluster_source}:{s.k}:{s.layer}:{s.cluster}"

    @property
    def focus(self) -> np.ndarray:
        """bool [N]: the samples of the cluster in focus."""
        return self.settings.cluster_rows(self.clusters)

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
        s = self.settings
        return _per_sample(self.ws.key, s.layer, method, self.target_key, s.batch_size,
                           self.ws.model, self.ws.data.inputs, self.targets,
                           ProgressLine(f"Scoring neurons by {plots.method_label(method)}"))

    def focus_targets(self) -> Optional[torch.Tensor]:
        return None if self.targets is None else self.targets[torch.from_numpy(self.focus)]

    def focus_inputs(self) -> torch.Tensor:
        return self.ws.data.inputs[torch.from_numpy(self.focus)]

    def findings(self, user_scores: Optional[np.ndarray] = None,
                 user_key: str = "") -> list:
        """The degeneracy checks of the cluster in focus (cached)."""
        s = self.settings
        return _findings(self.ws.key, s.layer, s.method, self.target_key, self.cluster_key,
                         s.reduce, s.batch_size, user_key, self.ws.model, self.focus_inputs(),
                         self.focus_targets(), user_scores,
                         ProgressLine("Running the degeneracy checks"))

    def oracle(self, methods: Sequence[str]):
        """Agreement of `methods` with ablation on the cluster in focus (cached)."""
        s = self.settings
        return _oracle(self.ws.key, s.layer, tuple(methods), self.target_key, self.cluster_key,
                       s.reduce, s.batch_size, self.ws.model, self.focus_inputs(),
                       self.focus_targets(), ProgressLine("Comparing every method with exact "
                                                          "ablation"))

    def predictions(self) -> np.ndarray:
        return predictions(self.ws)

    def cluster_label(self, cluster: Any) -> str:
        return cluster_label(cluster, self.settings.cluster_source, self.ws.class_names)

    def pruning_curves(self, **run):
        """The focus cluster's pruning curves against the rest, ranked by the main method's
        cluster scores (`AnalysisSettings.pruning_curves`); `run`: progress=, resume=."""
        s = self.settings
        return s.pruning_curves(self.ws.model, self.ws.data, self.clusters, self.targets,
                                s.ranking(self.scores(s.method), self.clusters), **run)

    def curve_key(self) -> tuple:
        s = self.settings
        return (self.ws.key, s.layer, s.method, self.target_key, self.cluster_key, s.reduce,
                s.metric, s.n_random, s.batch_size)


def context() -> Context:
    """The context the sidebar built in this run (app.py calls `sidebar` first)."""
    return st.session_state["context"]


# ------------------------------------------------------------------ choices and the URL

def _from_url() -> dict[str, str]:
    """URL parameters not yet applied to a widget (read once per session). A link to an
    uploaded model's view waits until the files are uploaded."""
    if "url_choices" not in st.session_state:
        st.session_state["url_choices"] = {key: st.query_params[param]
                                           for key, param in URL_KEYS.items()
                                           if param in st.query_params}
    if _waits_for_upload():
        return {}
    return st.session_state["url_choices"]


def _waits_for_upload() -> bool:
    return (st.session_state.get("url_choices", {}).get("w_source") == UPLOAD
            and "upload" not in st.session_state)


def _prepare(key: str, options: Sequence, default: Any) -> None:
    """Give widget `key` a valid value before it is drawn: from the URL on a session's first
    run, else its own value while still an option, else `default`."""
    wanted = _from_url().pop(key, None)
    if wanted is not None:
        match = [option for option in options if str(option) == wanted]
        if match:
            st.session_state[key] = match[0]
            return
    if st.session_state.get(key) not in options:
        st.session_state[key] = default


def apply_choice(key: str, value: Any) -> None:
    """Change sidebar choice `key` (a widget key, e.g. "w_reduce") from a page. Call it as a
    button's on_click: the next run draws the sidebar and computes with `value`."""
    st.session_state[key] = value


def switch_page(page: str, **params: str) -> None:
    """st.switch_page that keeps every choice. Streamlit drops widget values on a rerun the
    script itself requests, so the choices travel in the page address (with `params` added)
    and the next run applies them as it applies a shared link."""
    address = {param: value for param, value in st.query_params.to_dict().items()}
    address.update(params)
    st.session_state.pop("url_choices", None)  # read the address again on the next run
    st.switch_page(page, query_params=address)


def url_choice(key: str) -> Optional[str]:
    """A page's own choice from a shared link, once per session (e.g. "w_neuron"), else None."""
    return _from_url().pop(key, None)


def page_choice(key: str) -> Any:
    """A page's own setting (metric, random orders): its widget's value while the page is
    shown, else the value kept from the last visit or the URL."""
    default, options = _PAGE_KEYS[key]
    kept = st.session_state.setdefault("kept", {})
    if key in st.session_state:
        kept[key] = st.session_state[key]
    elif key in _from_url():
        wanted = _from_url().pop(key)
        kept[key] = next((option for option in options if str(option) == wanted), default)
    return kept.get(key, default)


def page_widget(key: str) -> None:
    """Restore a page widget's kept value before drawing it (Streamlit forgets the state of
    widgets that were not drawn in the last run)."""
    st.session_state[key] = page_choice(key)


def _sync_url() -> None:
    choices = {}
    for key, param in URL_KEYS.items():
        value = st.session_state.get(key, st.session_state.get("kept", {}).get(key))
        if value is None:
            continue
        choices[param] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    if "class" in choices and st.session_state.get("w_target") != "fixed":
        del choices["class"]
    if "k" in choices and not str(st.session_state.get("w_cluster_by", "")).startswith("kmeans"):
        del choices["k"]
    if {k: st.query_params.get(k) for k in choices} != choices or \
            set(st.query_params.keys()) - set(choices):
        st.query_params.from_dict(choices)


CLUSTER_SHOWN = "cluster_shown"  # session state: what the last run's cluster choice was


@dataclass(frozen=True)
class ClusterShown:
    """The cluster in focus as the last run showed it, and the partition it belongs to."""

    partition: tuple  # equal for partitions whose equal ids name the same group
    labels_key: tuple  # what the option labels follow from (they change with it)
    cluster: Any
    label: str
    words: str  # the partition in words, e.g. "k-means on the inputs (k = 8)"
    title: str  # the model and data


def _partition_words(source: str, k: int, layer: str) -> str:
    words = CLUSTER_SOURCE_LABELS.get(source, source)
    if source == "kmeans_activations":
        words = f"k-means on layer {layer}"
    return words + (f" (k = {k})" if source.startswith("kmeans") else "")


def _prepare_cluster(ws: Workspace, source: str, ids: list, bar) -> None:
    """Give the Cluster widget a cluster of the current partition before it is drawn.

    Ids of class-valued sources name the same group in any data (class 3 of the true and of
    the predicted labels; a correctness or provided name); k-means ids name nothing beyond
    their own clustering. A cluster
    chosen in a partition where it does not exist (other source, k, layer or data) is
    replaced by the first cluster, and a notice says which and why. Streamlit's selectbox
    keeps the option's label as its value, so the value is set again whenever the labels
    may have changed: the widget then never shows a label of another partition."""
    state = st.session_state
    kmeans = source.startswith("kmeans")
    layer = state["w_layer"] if source == "kmeans_activations" else ""
    class_valued = "classes" if source in ("label", "predicted") else source
    partition = (source, state["w_k"], layer, ws.key) if kmeans else (class_valued,)
    labels_key = (ws.key, source, state["w_k"], layer)  # what the option labels follow
    last = state.get(CLUSTER_SHOWN)
    # a run stopped before the sidebar was drawn makes Streamlit forget the widget's value
    chosen = state.get("w_cluster", None if last is None else last.cluster)
    wanted = _from_url().pop("w_cluster", None)
    if wanted is not None:
        chosen = next((c for c in ids if str(c) == wanted), ids[0])
    elif last is not None and (chosen not in ids or last.partition != partition):
        chosen = ids[0]
        if last.cluster is not None:
            words = _partition_words(source, state["w_k"], layer)
            old, new = last.words, words
            if last.title != ws.title:
                old, new = f"{old} of {last.title}", f"{new} of {ws.title}"
            notice = (f"Cluster {last.label} of {old} does not exist in {new} "
                      f"({len(ids)} clusters); showing cluster "
                      f"{cluster_label(chosen, source, ws.class_names)}.")
            state["cluster_notice"] = (partition, chosen, notice)
            st.toast(escape_markdown(notice), icon=":material/swap_horiz:")
    elif chosen not in ids:
        chosen = ids[0]
    if chosen != state.get("w_cluster") or last is None or last.labels_key != labels_key:
        state["w_cluster"] = chosen  # sent to the browser with the current labels
    shown = state.get("cluster_notice")
    if shown is not None and shown[:2] == (partition, chosen):
        bar.warning(escape_markdown(shown[2]), icon=":material/swap_horiz:")
    else:
        state.pop("cluster_notice", None)
    state[CLUSTER_SHOWN] = ClusterShown(
        partition, labels_key, chosen, cluster_label(chosen, source, ws.class_names),
        _partition_words(source, state["w_k"], layer), ws.title)


def _axis_label(info: at.LayerInfo, axis: int) -> str:
    """One option of the "Neurons along" box, e.g. "features · 128 (dim 2, found from the data)"."""
    size = info.shape[axis - 1]
    if axis != info.neuron_axis:
        return f"positions · {size} (dim {axis})"
    found = "the default" if info.axis_rule == "channels first" else "found from the data"
    return f"{info.unit} · {size} (dim {axis}, {found})"


def _axis_choice(bar, info: at.LayerInfo) -> at.LayerInfo:
    """The layer with the neuron axis the user chose: a box for layers with positions (the
    axis found from the data until the user picks another), and a line saying which is used."""
    if not info.positions:
        st.session_state.pop("w_axis", None)
        return info
    if st.session_state.get("axis_of") != info.name:  # another layer: its own axis first
        st.session_state.pop("w_axis", None)
        st.session_state["axis_of"] = info.name
    axes = list(range(1, len(info.shape) + 1))
    _prepare("w_axis", axes, info.neuron_axis)
    bar.selectbox("Neurons along", axes, key="w_axis",
                  format_func=lambda axis: _axis_label(info, axis),
                  help="Which dim of the layer's output holds its neurons (dim 0 is the "
                       "batch); the scores of the other dims' positions are pooled.")
    chosen = info.with_axis(st.session_state["w_axis"])
    bar.caption(f"Neurons: {escape_markdown(chosen.axis_words())}.")
    return chosen


def sidebar() -> Optional[Context]:
    """Draw the sidebar choices; store and return the context (None after an error shown)."""
    bar = st.sidebar
    st.session_state.pop("context", None)
    sources = list(DEMOS) + ([UPLOAD] if "upload" in st.session_state else [])
    if st.session_state.pop("upload_is_new", False):
        st.session_state["w_source"] = UPLOAD
    _prepare("w_source", sources, sources[0])
    if _waits_for_upload():
        bar.info("This link shows a view of an uploaded model: upload the same model and data "
                 "on the Model & data page to see it.", icon=":material/upload_file:")
    uploaded = st.session_state.get("upload")
    bar.selectbox("Model and data", sources, key="w_source",
                  format_func=lambda s: ("Uploaded: " + uploaded.model_name if s == UPLOAD
                                         else DEMO_TITLES.get(s, s)),
                  help="Upload your own model and data on the Model & data page.")
    try:
        ws = _workspace_of(st.session_state["w_source"], uploaded)
    except at.AttributionError as error:
        show_error(error, before="The model or data could not be loaded: ")
        return None

    layer_names = [info.name for info in ws.layers]
    info_of = {info.name: info for info in ws.layers}
    _prepare("w_layer", layer_names, default_layer(ws.layers))
    bar.selectbox("Layer", layer_names, key="w_layer",
                  format_func=lambda n: f"{n} · {info_of[n].kind} · {info_of[n].describe()}",
                  help="A neuron is a unit of a Linear layer, a channel of a conv layer, or a "
                       "feature of a layer applied at every position of a sequence (found from "
                       "the data: its positions follow the input's length).")
    layer = _axis_choice(bar, info_of[st.session_state["w_layer"]]).spec

    has_labels = ws.data.labels is not None
    sources_ok = [s for s in ("label", "predicted", "correctness", "provided", "kmeans_inputs",
                              "kmeans_activations")
                  if (has_labels or s not in ("label", "correctness"))
                  and (ws.data.clusters is not None or s != "provided")]
    _prepare("w_cluster_by", sources_ok, sources_ok[0])
    bar.selectbox("Clusters from", sources_ok, key="w_cluster_by",
                  format_func=CLUSTER_SOURCE_LABELS.get,
                  help="How samples are grouped; scores are averaged within each cluster.")
    cluster_by = st.session_state["w_cluster_by"]
    k_options = list(range(2, max(3, min(21, len(ws.data) + 1))))
    _prepare("w_k", k_options, 8)
    if cluster_by.startswith("kmeans"):
        bar.select_slider("Number of k-means clusters", k_options, key="w_k")
    try:
        clusters = _clusters(ws.key, cluster_by, st.session_state["w_k"],
                             layer if cluster_by == "kmeans_activations" else "", 256,
                             ws.loaded, ws.data, ProgressLine("Grouping samples into clusters"))
    except at.AttributionError as error:
        show_error(error, before="Could not form clusters: ")
        return None
    ids, counts = np.unique(clusters, return_counts=True)
    sizes = dict(zip(ids.tolist(), counts.tolist()))
    id_list = ids.tolist()
    mixes = {}  # k-means clusters say what they mix
    if cluster_by.startswith("kmeans"):
        classes = ws.data.labels.numpy() if has_labels else predictions(ws)
        composition = cluster_composition(clusters, classes, ws.class_names)
        mixes = {c: " · " + describe_mix(composition, c, shown=1) for c in id_list}
    _prepare_cluster(ws, cluster_by, id_list, bar)
    bar.selectbox("Cluster", id_list, key="w_cluster",
                  format_func=lambda c: f"{cluster_label(c, cluster_by, ws.class_names)} · "
                                        f"{sizes[c]} samples{mixes.get(c, '')}",
                  help="The cluster whose neurons the pages rank and prune.")

    methods = list(at.methods_for(ws.data.inputs.dtype))
    _prepare("w_method", methods, DEFAULT_METHOD)
    bar.selectbox("Method", methods, key="w_method", format_func=plots.method_label,
                  help="How a neuron's importance for one sample is measured.")
    if not isinstance(st.session_state.get("w_compare"), list) or any(
            m not in methods for m in st.session_state["w_compare"]):
        st.session_state["w_compare"] = list(DEFAULT_COMPARE)
    wanted = _from_url().pop("w_compare", None)
    if wanted is not None:
        st.session_state["w_compare"] = [m for m in wanted.split(",") if m in methods]
    bar.multiselect("Compare with", methods, key="w_compare", format_func=plots.method_label,
                    help="Methods shown beside the main one on the Scores page.")

    _prepare("w_reduce", ["mean", "mean_abs"], "mean")
    bar.radio("Reduction over a cluster", ["mean", "mean_abs"], key="w_reduce", horizontal=True,
              format_func=plots.REDUCTION_LABELS.get,
              help="Signed mean: positive and negative effects cancel. Mean |·|: magnitude.")
    targets_ok = [t for t in ("true", "predicted", "fixed") if has_labels or t != "true"]
    _prepare("w_target", targets_ok, targets_ok[0])
    bar.radio("Score the logit of the", targets_ok, key="w_target",
              format_func=TARGET_LABELS.get, horizontal=True)
    classes = list(range(ws.loaded.n_classes))
    _prepare("w_class", classes, 0)
    if st.session_state["w_target"] == "fixed":
        bar.selectbox("Class", classes, key="w_class",
                      format_func=lambda c: cluster_label(c, "label", ws.class_names))
    _prepare("w_batch", list(BATCH_SIZES), 256)
    bar.select_slider("Batch size", list(BATCH_SIZES), key="w_batch",
                      help="Samples per pass; results do not depend on it, memory does.")

    state = st.session_state
    settings = AnalysisSettings(
        layer=layer, method=state["w_method"], compare=tuple(state["w_compare"]),
        cluster_source=cluster_by, k=state["w_k"], cluster=state["w_cluster"],
        reduce=state["w_reduce"], target=state["w_target"], fixed_class=state["w_class"],
        metric=page_choice("w_metric"), n_random=page_choice("w_random"),
        batch_size=state["w_batch"])
    targets = settings.targets(ws.data, ws.loaded.n_classes)
    ctx = Context(ws, settings, clusters, targets)
    st.session_state["context"] = ctx
    _sync_url()
    bar.caption("Choices are kept across pages and in the page address: copy the URL to "
                "share this view.")
    if _waits_for_upload():  # not the demo's results under a link to another model's view
        wanted = ", ".join(f"{URL_KEYS[key]} {value}" for key, value in
                           st.session_state["url_choices"].items() if key != "w_source")
        st.info("This link shows a view of an uploaded model"
                + (f" ({escape_markdown(wanted)})" if wanted else "") + ". Upload the same "
                "model and data on the Model & data page to see it; the choices are applied "
                "then.", icon=":material/upload_file:")
        st.page_link("pages/data.py", label="Upload the model and data",
                     icon=":material/upload_file:")
        return None
    return ctx


# ------------------------------------------------------------------ entry point
# Streamlit 1.67 treats a pages/ folder next to app.py as its legacy folder navigation until
# st.navigation first runs in the server process (and AppTest re-enters it on every run): a
# page's address (/pruning?layer=...) then runs that page script alone, without app.py. Each
# page therefore starts with `require_entrypoint()`, which runs app.py in its place, the way
# Streamlit itself runs app.py for the root address in that mode.

APP_SCRIPT = Path(__file__).resolve().parents[1] / "app.py"
ENTRYPOINT_RAN = "entrypoint_ran"  # session-state flag: app.py is about to run a page


def run_page(page: st.Page) -> None:
    """Run the page st.navigation chose (in app.py), telling its `require_entrypoint` so."""
    st.session_state[ENTRYPOINT_RAN] = True
    page.run()


def require_entrypoint() -> None:
    """Call first in every page script. When app.py did not run this page, run app.py here
    instead: its st.navigation picks this same page from the address, with the sidebar and
    the URL's settings, and this run stops after it."""
    if st.session_state.pop(ENTRYPOINT_RAN, False):
        return
    runpy.run_path(str(APP_SCRIPT), run_name="__main__")
    st.stop()


# ------------------------------------------------------------------ small drawing helpers

def chart(figure: go.Figure | dict, key: Optional[str] = None,
          on_click: Optional[Callable[[], None]] = None) -> None:
    """Draw a plotly figure the same way on every page (the figure's own colours).
    `on_click` runs when the user clicks a point; the selection is then in
    st.session_state[key]["selection"]["points"]."""
    clicks = {} if on_click is None else dict(on_select=on_click, selection_mode="points")
    st.plotly_chart(drawn_once(figure, clickable=on_click is not None), theme=None, key=key,
                    config={"displaylogo": False}, **clicks)


# Streamlit's PlotlyChart (1.67) draws a new chart twice: Plotly.react at plotly's own size,
# then again with the column's measured width, its click modes and a JSON copy of the figure
# (every object new). plotly.js diffs the second call against the first and replots in full
# (20-30 ms of Chromium's time a Scores chart) when it sees a change: a template object that
# is not the same object, a typed array (how plotly.py sends numpy arrays), any new data array
# when the layout has no datarevision, or a changed clickmode. `drawn_once` sends none of
# these, so the second call only restyles (the click modes are the ones the frontend would set,
# the template's values are written into the figure, and nothing changes data in place within
# one chart: Streamlit mounts a new chart for every new spec).
_ITEM_DEFAULTS = {"annotations": "annotationdefaults", "shapes": "shapedefaults",
                  "images": "imagedefaults", "selections": "selectiondefaults",
                  "sliders": "sliderdefaults", "updatemenus": "updatemenudefaults"}


def drawn_once(figure: go.Figure | dict, clickable: bool = False) -> go.Figure | dict:
    """`figure` (a plotly figure or its dict, left as it is) as Streamlit's frontend draws in
    one pass: its template applied (layout, axes, items and per-type trace defaults, as
    plotly.js applies them), arrays as lists, a fixed layout.datarevision and, when
    `clickable`, the frontend's click modes."""
    # the figure's own objects, not to_dict(): that encodes each array as base64 for _plain
    # to decode again
    spec = _plain(figure if isinstance(figure, dict) else
                  dict(data=list(figure.data), layout=figure.layout))
    layout = spec.setdefault("layout", {})
    spec.setdefault("data", [])
    categories = _category_axes(spec["data"])
    if categories is None:  # grid defaults it cannot tell: sent as it is (drawn twice)
        return figure
    template = layout.pop("template", None) or {}
    defaults = template.get("layout", {})
    for name in set(layout) | set(defaults):
        default = defaults.get(name, defaults.get(name.rstrip("0123456789")))  # xaxis2: xaxis
        if name in _ITEM_DEFAULTS:
            layout[name] = _items(layout.get(name) or [], defaults.get(name) or [],
                                  defaults.get(_ITEM_DEFAULTS[name]) or {})
        elif re.fullmatch(r"[xy]axis\d*", name):
            own = _axis_switches(layout.get(name) or {}, default or {}, name in categories)
            layout[name] = _under(own, default)
        elif name not in _ITEM_DEFAULTS.values():
            layout[name] = _under(layout.get(name), default)
    per_type: dict[str, int] = {}
    for index, trace in enumerate(spec["data"]):
        kind = trace.get("type", "scatter")
        items = template.get("data", {}).get(kind) or [{}]
        spec["data"][index] = _under(trace, items[per_type.get(kind, 0) % len(items)])
        per_type[kind] = per_type.get(kind, 0) + 1
    layout.setdefault("datarevision", 1)
    if clickable:  # what the frontend sets for selection_mode="points"
        layout["dragmode"] = layout.get("dragmode") or "pan"
        layout["clickmode"] = "event" if layout["dragmode"] in ("select", "lasso") \
            else "event+select"
        layout["hovermode"] = layout.get("hovermode") or "closest"
    sent = go.Figure(spec, _validate=False)
    sent.layout.template = None  # not plotly.py's default template: none at all
    return sent


_SWITCHED_BY = {"showline": ("linecolor", "linewidth"),
               "showgrid": ("gridcolor", "gridwidth", "griddash"),
               "zeroline": ("zerolinecolor", "zerolinewidth")}
_ORIENTATION = {  # bar-like trace -> its orientation when it sets none (plotly.js defaults)
    "bar": lambda trace: "h" if "x" in trace and "y" not in trace else "v",
    "waterfall": lambda trace: "h" if "x" in trace and "y" not in trace else "v",
    "histogram": lambda trace: "h" if "y" in trace and "x" not in trace else "v",
    "funnel": lambda trace: "v" if "y" in trace and "x" not in trace else "h",
    "box": lambda trace: None, "violin": lambda trace: None}  # from their data: not told


def _category_axes(traces: list[dict]) -> Optional[set[str]]:
    """Layout names of the axes along which bar-like traces lay their categories (plotly.js
    draws no grid or zero line there by default); None when an orientation is unknown."""
    names = set()
    for trace in traces:
        kind = trace.get("type", "scatter")
        if kind not in _ORIENTATION:
            continue
        orientation = trace.get("orientation") or _ORIENTATION[kind](trace)
        if orientation is None:
            return None
        axis = trace.get("yaxis", "y") if orientation == "h" else trace.get("xaxis", "x")
        names.add(axis[0] + "axis" + axis[1:])
    return names


def _axis_switches(own: dict, default: dict, categories: bool) -> dict:
    """A cartesian axis's own settings with its line, grid and zero-line switches as plotly.js
    sets them, where `default` (its template) has a colour or width for them: plotly.js
    switches them on for such a value in the figure, never for one in the template (grid
    and zero line are on anyway, except along categories)."""
    own = dict(own)
    for switch, values in _SWITCHED_BY.items():
        if switch not in own and any(value in default for value in values):
            given = any(own.get(value) for value in values)
            own[switch] = given if switch == "showline" else given or not categories
    return own


def _under(value: Any, default: Any) -> Any:
    """`value` with what it leaves unset taken from `default` (dicts merged key by key)."""
    if value is None:
        return default
    if isinstance(value, dict) and isinstance(default, dict):
        return {**default, **{key: _under(item, default.get(key)) for key, item in value.items()}}
    return value


def _items(entries: list, named: list, default: dict) -> list:
    """A layout array (annotations, shapes...) as its template fills it: each entry over the
    template item its templateitemname names (none found: hidden) or the array's defaults;
    named template items no entry used are drawn as well."""
    by_name = {item["name"]: item for item in named if item.get("name")}
    filled, used = [], set()
    for entry in entries:
        wanted = entry.get("templateitemname")
        if wanted in by_name:
            used.add(wanted)
            item = {key: value for key, value in by_name[wanted].items() if key != "name"}
            filled.append(_under({key: value for key, value in entry.items()
                                  if key != "templateitemname"}, item))
        else:
            hidden = dict(entry, visible=entry.get("visible") or False) if wanted else entry
            filled.append(_under(hidden, default))
    return filled + [item for name, item in by_name.items() if name not in used]


def _plain(value: Any) -> Any:
    """`value` (a figure's dict, copied) with its arrays (numpy, pandas or plotly.py's
    typed-array specs) as lists and plotly objects as dicts."""
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            shape = [int(size) for size in str(value.get("shape", array.size)).split(",")]
            return array.reshape(shape).tolist()
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "to_plotly_json"):  # a plotly object inside a dict
        return _plain(value.to_plotly_json())
    return value.tolist() if hasattr(value, "tolist") else value  # numpy, pandas


def show_error(message: object, before: str = "", after: str = "") -> None:
    """A user mistake as an error box: the message's first line as plain text (it may quote
    file names, layer or key names), further lines (a code recipe) in a code block."""
    first, *rest = str(message).split("\n")
    st.error(before + escape_markdown(first) + after, icon=":material/error:")
    if rest:
        st.code("\n".join(rest), language="python")


def guarded(action: Callable[[], Any]) -> Any:
    """Run `action`; a user mistake (AttributionError) becomes a message and None."""
    try:
        return action()
    except at.AttributionError as error:
        show_error(error)
        return None


if __name__ == "__main__":  # run as a page itself (/common under the legacy navigation)
    require_entrypoint()

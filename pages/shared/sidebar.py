"""The sidebar: every choice behind the view (model and data, layer, clusters, cluster,
methods, reduction, target, batch size), each given a valid value before it is drawn (from a
shared link on a session's first run, else its own, else a default), and the `Context` they
imply, stored for the pages. Pages change a choice with `apply_choice`; a page's own widgets
(the Pruning page's metric and random orders) keep their value while the page is not shown
(`page_choice`, `page_widget`).

Every domain decision (the default layer and method, which cluster sources and targets a
dataset offers and which is chosen first, the k options, the partition's words, the metric,
random-order and batch-size options) is `attribution.analyses.settings`', which the report
and the command line read too; this module only draws them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import streamlit as st

import attribution as at
from attribution.presentation import plots
from attribution.inputs.demo import DEMOS
from attribution.analyses import settings as analysis
from attribution.analyses.settings import (AnalysisSettings, cluster_label, cluster_source_label,
                                           is_regression, partition_words, target_label)
from attribution.analyses.verdict import cluster_composition, describe_mix
from attribution.analyses.clusters import quartiles
from pages.shared.context import Context
from pages.shared.draw import escape_markdown, show_error
from pages.shared.progress import ProgressLine
from pages.shared.url import URL_KEYS, from_url, sync_url, waits_for_upload
from pages.shared.workspace import (DEMO_TITLES, UPLOAD, Workspace, cluster_ids, predictions,
                                    workspace_of)

CHOICE_KEYS = {"reduce": "w_reduce", "method": "w_method", "cluster_source": "w_cluster_by"}
SIDEBAR_BOX_CHARS = 36
"""About the most characters a sidebar select box shows before it cuts its text with "…";
a longer layer choice is written out in full beneath it."""
"""`attribution.analyses.verdict.Remedy.choice` -> the sidebar widget it changes
(`apply_choice`)."""
_PAGE_KEYS = {  # widgets that live on one page: (default, options)
    "w_metric": (analysis.DEFAULT_METRIC, tuple(analysis.METRIC_LABELS)),
    "w_random": (analysis.DEFAULT_N_RANDOM, analysis.RANDOM_ORDERS)}


def _prepare(key: str, options: Sequence, default: Any) -> None:
    """Give widget `key` a valid value before it is drawn: from the URL on a session's first
    run, else its own value while still an option, else `default`.

    The value is written every run, so the browser is always sent it. A widget's id includes
    the running script's: a shared link's first run on a fresh server runs the page script
    alone (`routing.require_entrypoint`), so the next run, through st.navigation, draws the
    sidebar's widgets under new ids, which the browser would show at their first option
    (the Layer box read "fc1" above a relu1 view) had the value not been written again."""
    wanted = from_url().pop(key, None)
    match = [option for option in options if str(option) == wanted]
    current = st.session_state.get(key)
    st.session_state[key] = match[0] if match else current if current in options else default


def apply_choice(key: str, value: Any) -> None:
    """Change sidebar choice `key` (a widget key, e.g. "w_reduce") from a page. Call it as a
    button's on_click: the next run draws the sidebar and computes with `value`."""
    st.session_state[key] = value


def apply_partition(source: str, cluster: Any) -> None:
    """Change the cluster source and the cluster in focus together from a page (a button's
    on_click, as `apply_choice`): the next run shows `cluster` of the new partition, without
    the notice that a cluster was replaced (nothing was: this one was asked for)."""
    st.session_state["w_cluster_by"] = source
    st.session_state["w_cluster"] = cluster
    st.session_state.pop(CLUSTER_SHOWN, None)


def page_choice(key: str, options: Optional[Sequence] = None, default: Any = None) -> Any:
    """A page's own setting (metric, random orders): its widget's value while the page is
    shown, else the value kept from the last visit or the URL; one of `options` (default:
    `_PAGE_KEYS`'), else `default`."""
    if options is None:
        default, options = _PAGE_KEYS[key]
    kept = st.session_state.setdefault("kept", {})
    if key in st.session_state:
        kept[key] = st.session_state[key]
    elif key in from_url():
        wanted = from_url().pop(key)
        kept[key] = next((option for option in options if str(option) == wanted), default)
    if kept.get(key, default) not in options:
        kept[key] = default
    return kept.get(key, default)


def page_widget(key: str, options: Optional[Sequence] = None, default: Any = None) -> None:
    """Restore a page widget's kept value before drawing it (Streamlit forgets the state of
    widgets that were not drawn in the last run); `options`, `default` as in `page_choice`."""
    st.session_state[key] = page_choice(key, options, default)


def metric_options(ws: Workspace) -> tuple[tuple[str, ...], str]:
    """(the pruning metrics this model and data can measure, the default one)."""
    regression, has_labels = is_regression(ws.loaded.n_classes), ws.data.labels is not None
    return (analysis.metric_choices(regression=regression, has_labels=has_labels),
            analysis.default_metric(regression=regression, has_labels=has_labels))


CLUSTER_SHOWN = "cluster_shown"  # session state: what the last run's cluster choice was


@dataclass(frozen=True)
class ClusterShown:
    """The cluster in focus as the last run showed it, and the partition it belongs to."""

    partition: tuple  # equal for partitions whose equal ids name the same group
    cluster: Any
    label: str
    words: str  # the partition in words, e.g. "k-means on the inputs (k = 8)"
    title: str  # the model and data


def _prepare_cluster(ws: Workspace, source: str, ids: list, bar, page: str) -> None:
    """Give the Cluster widget a cluster of the current partition before it is drawn.

    Ids of class-valued sources name the same group in any data (class 3 of the true and of
    the predicted labels; a correctness or provided name); k-means ids name nothing beyond
    their own clustering. A cluster
    chosen in a partition where it does not exist (other source, k, layer or data) is
    replaced by the first cluster, and a notice says which and why: a toast, and a box in
    the sidebar while the user stays on `page`, where it happened. The value is written
    every run (as `_prepare` writes its): the widget then never shows a label of another
    partition, nor its first option under a new id."""
    state = st.session_state
    kmeans = source.startswith("kmeans")
    layer = state["w_layer"] if source == "kmeans_activations" else ""
    class_valued = "classes" if source in ("label", "predicted") else source
    partition = (source, state["w_k"], layer, ws.key) if kmeans else (class_valued,)
    last = state.get(CLUSTER_SHOWN)
    # a run stopped before the sidebar was drawn makes Streamlit forget the widget's value
    chosen = state.get("w_cluster", None if last is None else last.cluster)
    wanted = from_url().pop("w_cluster", None)
    if wanted is not None:
        chosen = next((c for c in ids if str(c) == wanted), ids[0])
    elif last is not None and (chosen not in ids or last.partition != partition):
        chosen = ids[0]
        if last.cluster is not None:
            words = partition_words(source, state["w_k"], layer,
                                    is_regression(ws.loaded.n_classes))
            old, new = last.words, words
            if last.title != ws.title:
                old, new = f"{old} of {last.title}", f"{new} of {ws.title}"
            notice = (f"Cluster {last.label} of {old} does not exist in {new} "
                      f"({len(ids)} cluster{'s' if len(ids) != 1 else ''}); showing cluster "
                      f"{cluster_label(chosen, source, ws.class_names)}.")
            state["cluster_notice"] = (partition, chosen, page, notice)
            st.toast(escape_markdown(notice), icon=":material/swap_horiz:")
    elif chosen not in ids:
        chosen = ids[0]
    state["w_cluster"] = chosen  # sent to the browser every run, with the current labels
    shown = state.get("cluster_notice")
    if shown is not None and shown[:3] == (partition, chosen, page):
        bar.warning(escape_markdown(shown[3]), icon=":material/swap_horiz:")
    else:
        state.pop("cluster_notice", None)
    state[CLUSTER_SHOWN] = ClusterShown(
        partition, chosen, cluster_label(chosen, source, ws.class_names),
        partition_words(source, state["w_k"], layer, is_regression(ws.loaded.n_classes)),
        ws.title)


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


def sidebar(page: str = "") -> Optional[Context]:
    """Draw the sidebar choices on `page` (its address); store and return the context (None
    after an error shown)."""
    bar = st.sidebar
    st.session_state.pop("context", None)
    sources = list(DEMOS) + ([UPLOAD] if "upload" in st.session_state else [])
    if st.session_state.pop("upload_is_new", False):
        st.session_state["w_source"] = UPLOAD
    _prepare("w_source", sources, sources[0])
    if waits_for_upload():
        bar.info("This link shows a view of an uploaded model: upload the same model and data "
                 "on the Model & data page to see it.", icon=":material/upload_file:")
    uploaded = st.session_state.get("upload")
    bar.selectbox("Model and data", sources, key="w_source",
                  format_func=lambda s: ("Uploaded: " + uploaded.model_name if s == UPLOAD
                                         else DEMO_TITLES.get(s, s)),
                  help="Upload your own model and data on the Model & data page.")
    try:
        ws = workspace_of(st.session_state["w_source"], uploaded)
    except at.AttributionError as error:
        show_error(error, before="The model or data could not be loaded: ")
        return None

    layer_names = [info.name for info in ws.layers]
    info_of = {info.name: info for info in ws.layers}
    _prepare("w_layer", layer_names, analysis.default_layer(ws.layers))
    def layer_words(name: str) -> str:
        return f"{name} · {info_of[name].kind} · {info_of[name].describe()}"

    bar.selectbox("Layer", layer_names, key="w_layer", format_func=layer_words,
                  help="A neuron is a unit of a Linear layer, a channel of a conv layer, or a "
                       "feature of a layer applied at every position of a sequence (found from "
                       "the data: its positions follow the input's length).")
    if len(layer_words(st.session_state["w_layer"])) > SIDEBAR_BOX_CHARS:  # the box cuts it
        bar.caption(escape_markdown(layer_words(st.session_state["w_layer"])))
    layer = _axis_choice(bar, info_of[st.session_state["w_layer"]]).spec

    has_labels = ws.data.labels is not None
    has_provided = ws.data.clusters is not None
    regression = is_regression(ws.loaded.n_classes)
    sources_ok = list(analysis.cluster_source_choices(has_labels, has_provided,
                                                      regression=regression))
    _prepare("w_cluster_by", sources_ok,
             analysis.default_cluster_source(has_labels, has_provided))
    bar.selectbox("Clusters from", sources_ok, key="w_cluster_by",
                  format_func=lambda source: cluster_source_label(source, regression),
                  help="How samples are grouped; scores are averaged within each cluster.")
    cluster_by = st.session_state["w_cluster_by"]
    k_options = list(analysis.k_choices(len(ws.data)))
    _prepare("w_k", k_options, analysis.default_k(len(ws.data)))
    if cluster_by.startswith("kmeans"):
        bar.select_slider("Number of k-means clusters", k_options, key="w_k")
    try:
        clusters = cluster_ids(ws.key, cluster_by, st.session_state["w_k"],
                               layer if cluster_by == "kmeans_activations" else "",
                               analysis.DEFAULT_BATCH_SIZE, ws.loaded, ws.data,
                               ProgressLine("Grouping samples into clusters"))
    except at.AttributionError as error:
        show_error(error, before="Could not form clusters: ")
        return None
    ids, counts = np.unique(clusters, return_counts=True)
    sizes = dict(zip(ids.tolist(), counts.tolist()))
    id_list = ids.tolist()
    mixes = {}  # k-means clusters say what they mix
    if cluster_by.startswith("kmeans"):
        classes = ws.data.labels.numpy() if has_labels else predictions(ws)
        if regression:  # true values or outputs: what k-means mixes is their quartiles
            classes = quartiles(classes)
        composition = cluster_composition(clusters, classes, ws.class_names)
        mixes = {c: " · " + describe_mix(composition, c, shown=1) for c in id_list}
    _prepare_cluster(ws, cluster_by, id_list, bar, page)
    bar.selectbox("Cluster", id_list, key="w_cluster",
                  format_func=lambda c: f"{cluster_label(c, cluster_by, ws.class_names)} · "
                                        f"{sizes[c]} samples{mixes.get(c, '')}",
                  help="The cluster whose neurons the pages rank and prune.")

    layer_kind = info_of[st.session_state["w_layer"]].kind
    methods = list(at.methods_for(ws.data.inputs.dtype, layer_kind, ws.model))
    _prepare("w_method", methods, analysis.DEFAULT_METHOD)
    bar.selectbox("Method", methods, key="w_method", format_func=plots.method_label,
                  help="How a neuron's importance for one sample is measured.")
    compared = st.session_state.get("w_compare")
    if not isinstance(compared, list) or any(m not in methods for m in compared):
        compared = list(analysis.DEFAULT_COMPARE)
    wanted = from_url().pop("w_compare", None)
    if wanted is not None:
        compared = [m for m in wanted.split(",") if m in methods]
    others = [m for m in methods if m != st.session_state["w_method"]]  # not the main one
    st.session_state["w_compare"] = [m for m in compared if m in others]
    bar.multiselect("Compare with", others, key="w_compare", format_func=plots.method_label,
                    help="Methods shown beside the main one on the Scores page.")

    reductions = list(analysis.REDUCE_CHOICES)
    _prepare("w_reduce", reductions, analysis.DEFAULT_REDUCE)
    bar.radio("Reduction over a cluster", reductions, key="w_reduce", horizontal=True,
              format_func=analysis.REDUCTION_LABELS.get,
              help="Signed mean: positive and negative effects cancel. Mean |·|: magnitude.")
    targets_ok = list(analysis.target_choices(has_labels, regression=regression))
    _prepare("w_target", targets_ok, analysis.default_target(has_labels, regression=regression))
    bar.radio("Score" if regression else "Score the logit of the", targets_ok, key="w_target",
              format_func=lambda target: target_label(target, regression), horizontal=True,
              help="A model with one output (a regression head) has no classes: its score "
                   "is the output itself." if regression else None)
    classes = list(range(ws.loaded.n_classes))
    _prepare("w_class", classes, 0)
    if st.session_state["w_target"] == "fixed":
        bar.selectbox("Class", classes, key="w_class",
                      format_func=lambda c: cluster_label(c, "label", ws.class_names))
    _prepare("w_batch", list(analysis.BATCH_SIZES), analysis.DEFAULT_BATCH_SIZE)
    bar.select_slider("Batch size", list(analysis.BATCH_SIZES), key="w_batch",
                      help="Samples per pass; results do not depend on it, memory does.")

    state = st.session_state
    settings = AnalysisSettings(
        layer=layer, method=state["w_method"], compare=tuple(state["w_compare"]),
        cluster_source=cluster_by, k=state["w_k"], cluster=state["w_cluster"],
        reduce=state["w_reduce"], target=state["w_target"], fixed_class=state["w_class"],
        metric=page_choice("w_metric", *metric_options(ws)), n_random=page_choice("w_random"),
        batch_size=state["w_batch"])
    targets = settings.targets(ws.data, ws.loaded.n_classes)
    ctx = Context(ws, settings, clusters, targets)
    st.session_state["context"] = ctx
    sync_url()
    bar.caption("Choices are kept across pages and in the page address: copy the URL to "
                "share this view.")
    if waits_for_upload():  # not the demo's results under a link to another model's view
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

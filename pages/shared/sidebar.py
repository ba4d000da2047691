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
from attribution.inputs.demo import DEMOS
from attribution.analyses import settings as analysis
from attribution.analyses.settings import (SETTINGS, AnalysisSettings, cluster_label,
                                           is_regression, partition_words)
from attribution.analyses.verdict import cluster_composition, describe_mix
from attribution.analyses.clusters import quartiles
from pages.shared.context import Context
from pages.shared.draw import escape_markdown, show_error
from pages.shared.progress import ProgressLine
from pages.shared.url import URL_KEYS, from_url, sync_url, waits_for_upload
from pages.shared.workspace import (DEMO_TITLES, UPLOAD, Workspace, cluster_ids, predictions,
                                    workspace_of)

CHOICE_KEYS = {name: setting.key for name, setting in SETTINGS.items() if setting.key}
"""A setting (`attribution.analyses.verdict.Remedy.choice`) -> the widget that shows it
(`apply_choice`)."""
SIDEBAR_BOX_CHARS = 36
"""About the most characters a sidebar select box shows before it cuts its text with "…";
a longer layer choice is written out in full beneath it."""
_PAGE_KEYS = {  # widgets that live on one page: (default, options)
    "w_metric": (analysis.DEFAULT_METRIC, SETTINGS["metric"].choices),
    "w_random": (SETTINGS["n_random"].default, SETTINGS["n_random"].choices)}


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


def draw_setting(where, name: str, values: Sequence, regression: bool = False,
                 **widget_options) -> Any:
    """Draw the widget of `SETTINGS[name]` (the command line's option's twin) in `where`
    with `values` as its options: its label, help and menu words from the table unless
    `widget_options` (the Streamlit element's) say otherwise. Returns the value chosen."""
    setting = SETTINGS[name]
    options = {"label": setting.label, "help": setting.help,
               "format_func": lambda value: setting.word(value, regression),
               **widget_options}
    getattr(where, setting.widget)(options.pop("label"), list(values), key=setting.key,
                                   **options)
    return st.session_state[setting.key]


def choose(where, name: str, facts: analysis.DataFacts, values: Optional[Sequence] = None,
           drawn: bool = True, **widget_options) -> Any:
    """`SETTINGS[name]` for this data: given a valid value (`_prepare`: the link's, its own,
    else the table's default for `facts`) among `values` (default: the table's menu for
    `facts`), then drawn unless `drawn` is False (`draw_setting`). Returns the value."""
    setting = SETTINGS[name]
    values = list(setting.menu(facts) if values is None else values)
    _prepare(setting.key, values, setting.default_of(facts))
    if drawn:
        draw_setting(where, name, values, facts.regression, **widget_options)
    return st.session_state[setting.key]


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
    metric = SETTINGS["metric"]
    return metric.menu(ws.facts), metric.default_of(ws.facts)


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
    """One option of the "Neurons along" box, e.g. "features · 128 (dim 2, found from the
    data)"."""
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
    axis = draw_setting(bar, "neuron_axis", axes, format_func=lambda axis: _axis_label(info, axis))
    chosen = info.with_axis(axis)
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

    facts = ws.facts
    has_labels, regression = facts.has_labels, facts.regression
    info_of = {info.name: info for info in ws.layers}

    def layer_words(name: str) -> str:
        return f"{name} · {info_of[name].kind} · {info_of[name].describe()}"

    layer_name = choose(bar, "layer", facts, format_func=layer_words)
    if len(layer_words(layer_name)) > SIDEBAR_BOX_CHARS:  # the box cuts it
        bar.caption(escape_markdown(layer_words(layer_name)))
    layer = _axis_choice(bar, info_of[layer_name]).spec

    cluster_by = choose(bar, "cluster_source", facts)
    choose(bar, "k", facts, drawn=cluster_by.startswith("kmeans"))
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
    draw_setting(bar, "cluster", id_list,
                 format_func=lambda c: f"{cluster_label(c, cluster_by, ws.class_names)} · "
                                       f"{sizes[c]} samples{mixes.get(c, '')}")

    methods = list(at.methods_for(ws.data.inputs.dtype, info_of[layer_name].kind, ws.model))
    choose(bar, "method", facts, methods)
    compared = st.session_state.get("w_compare")
    if not isinstance(compared, list) or any(m not in methods for m in compared):
        compared = list(SETTINGS["compare"].default)
    wanted = from_url().pop("w_compare", None)
    if wanted is not None:
        compared = [m for m in wanted.split(",") if m in methods]
    others = [m for m in methods if m != st.session_state["w_method"]]  # not the main one
    st.session_state["w_compare"] = [m for m in compared if m in others]
    draw_setting(bar, "compare", others)

    choose(bar, "reduce", facts, horizontal=True)
    target = choose(bar, "target", facts, horizontal=True,
                    **({"label": "Score"} if regression else {}))
    choose(bar, "fixed_class", facts, range(ws.loaded.n_classes), drawn=target == "fixed",
           format_func=lambda c: cluster_label(c, "label", ws.class_names))
    choose(bar, "batch_size", facts)

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

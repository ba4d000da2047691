"""Pruning page: live top-k vs bottom-k vs random curves for the cluster in focus and for the
rest of the data, drawn while they compute, with a stop button and a summary in words."""
import time

import streamlit as st

import attribution as at
from attribution import plots
from attribution.pruning import spaced_ks
from attribution.report import CURVE_K_STEPS, curve_sentences, curve_targets
from pages import common

common.require_entrypoint()

REDRAW_SECONDS = 0.15  # at most this often while computing (the first points always at once)
MAX_KEPT_CURVES = 16  # finished curves kept per session

ctx = common.context()
s = ctx.settings
focus_label = ctx.cluster_label(s.cluster)

st.title("Pruning curves")
st.caption("Remove the layer's neurons one by one in the order of their scores and watch the "
           "model: if the scores mean anything, removing the highest-scored neurons first "
           "(orange) hurts more than removing them in random order (grey band), and removing "
           "the lowest-scored first (blue) hurts least.")

controls = st.columns([1, 1, 2])
common.page_widget("w_metric")
controls[0].selectbox("Measure", list(common.METRIC_LABELS), key="w_metric",
                      format_func=common.METRIC_LABELS.get)
common.page_widget("w_random")
controls[1].select_slider("Random orders", list(common.RANDOM_ORDERS), key="w_random",
                          help="More orders give a smoother band and take longer.")
titles = {"cluster": f"cluster {plots.plain(focus_label)}", "rest": "rest of the data"}
n_neurons = ctx.n_neurons
key = ctx.curve_key()
finished = st.session_state.setdefault("curves", {})
stopped = st.session_state.setdefault("stopped_curves", {})


def stop() -> None:
    stopped[key] = st.session_state.get("partial_curve")


def show(curves, note: str) -> None:
    common.chart(plots.pruning_figure(curves, n_neurons=n_neurons, metric=s.metric,
                                      titles=titles), key="pruning_chart")
    st.caption(note)


def summarise(curves) -> None:
    summary = at.curve_summary(curves)
    st.subheader("In words")
    for sentence in curve_sentences(summary, metric=s.metric, method=s.method,
                                    cluster=focus_label, sizes=curves.attrs.get("n_samples"),
                                    n_random=s.n_random):
        st.markdown(common.escape_markdown(sentence))
    scale, unit, gap_unit = (100.0, "%%", " pp") if s.metric == "accuracy" else (1.0, "", "")
    table = summary.assign(**{column: summary[column] * scale for column in
                              ("area_ranked", "area_bottom", "area_random", "gap_vs_random")},
                           fraction_random_beaten=summary["fraction_random_beaten"] * 100)
    number, digits = st.column_config.NumberColumn, 1 if s.metric == "accuracy" else 3
    st.dataframe(table, width="stretch", column_config={
        "subset": "samples",
        "area_ranked": number("mean over k: top-k", format=f"%.{digits}f{unit}"),
        "area_bottom": number("mean over k: bottom-k", format=f"%.{digits}f{unit}"),
        "area_random": number("mean over k: random", format=f"%.{digits}f{unit}"),
        "gap_vs_random": number("gap vs random", format=f"%+.{digits}f{gap_unit}"),
        "fraction_random_beaten": number("random orders beaten", format="%.0f%%")})
    st.caption("'Mean over k' is the area under each curve divided by the number of neurons: "
               "the metric averaged over every amount of pruning. The gap is positive when the "
               "ranking does more damage than random.")


if key in finished:
    show(finished[key], "Complete. Change the cluster, method or settings to compute again.")
    summarise(finished[key])
elif key in stopped:
    if stopped[key] is not None:
        show(stopped[key], "Stopped: the curve shows the points computed before the stop.")
    else:
        st.info("Stopped before the first points.")
    if st.button("Compute again", type="primary"):
        del stopped[key]
        st.rerun()
else:
    scores = common.guarded(lambda: ctx.scores(s.method))
    if scores is None:
        st.stop()
    row = plots.cluster_table(scores, ctx.clusters, s.reduce).loc[s.cluster].drop("n")
    status = st.empty()
    bar = status.progress(0.0, text="Computing the first points…")
    stop_slot = st.empty()
    stop_slot.button("Stop the curve", on_click=stop, icon=":material/stop_circle:")
    chart_slot = st.empty()
    last_draw, n_draws = [0.0], [0]

    def on_progress(fraction, partial) -> None:
        st.session_state["partial_curve"] = partial
        bar.progress(fraction, text=f"{fraction:.0%} of the k values computed")
        now = time.monotonic()
        if now - last_draw[0] >= REDRAW_SECONDS or fraction >= 1.0:
            last_draw[0], n_draws[0] = now, n_draws[0] + 1
            with chart_slot.container():  # a key per draw: two draws may show equal points
                common.chart(plots.pruning_figure(partial, n_neurons=n_neurons,
                                                  metric=s.metric, titles=titles),
                             key=f"partial_curve_{n_draws[0]}")

    st.session_state["partial_curve"] = None
    curves = common.guarded(lambda: at.cluster_pruning_curves(
        ctx.ws.model, s.layer, ctx.ws.data.inputs, curve_targets(ctx.ws.data, s.metric,
                                                                 ctx.targets),
        ctx.clusters, s.cluster, row.to_numpy(), ks=spaced_ks(n_neurons, CURVE_K_STEPS),
        n_random=s.n_random, metric=s.metric, batch_size=s.batch_size, progress=on_progress))
    status.empty()
    stop_slot.empty()
    if curves is not None:
        while len(finished) >= MAX_KEPT_CURVES:
            finished.pop(next(iter(finished)))
        finished[key] = curves
        with chart_slot.container():
            show(curves, "Complete.")
        summarise(curves)

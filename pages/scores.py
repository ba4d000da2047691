"""Scores page: clusters x neurons, one cluster's samples x neurons, ranked neurons with their
spread, the methods side by side, and the table behind them. Clicking a bar or a heatmap cell
opens that neuron on the Neuron page (a cell of the cluster heatmap also picks its cluster)."""
import numpy as np
import pandas as pd
import streamlit as st

import attribution as at
from attribution.analyses.costs import WORTH_SAYING_SECONDS
from attribution.presentation import plots
from attribution.presentation.report import csv_text
from attribution.analyses.neuron import neuron_from_point
from pages.shared.context import context
from pages.shared.draw import chart, escape_markdown, every_step_toggle, guarded
from pages.shared.routing import NEURON_CHOICE, NEURON_PAGE, require_entrypoint, switch_page
from pages.shared.sidebar import apply_choice

require_entrypoint()

SMALL_LAYER = 20  # layers up to this many neurons show every neuron's bar by default
OPEN_NEURON = "open_neuron"  # session state: a click asked for the Neuron page

if st.session_state.pop(OPEN_NEURON, False):
    switch_page(NEURON_PAGE, neuron=str(st.session_state[NEURON_CHOICE]))

ctx = context()
s = ctx.settings
focus_label = ctx.cluster_label(s.cluster)
cluster_of_label = {ctx.cluster_label(c): c for c in np.unique(ctx.clusters).tolist()}


def open_clicked(chart_key: str) -> None:
    """A click on a chart (callback): open the clicked neuron (and a heatmap row's cluster)."""
    points = st.session_state[chart_key]["selection"]["points"]
    for point in points:
        neuron = neuron_from_point(point)
        if neuron is None:
            continue
        if chart_key == "cluster_heatmap" and point.get("y") in cluster_of_label:
            apply_choice("w_cluster", cluster_of_label[point["y"]])
        st.session_state[NEURON_CHOICE] = neuron
        st.session_state[OPEN_NEURON] = True
        return

st.title("Neuron scores")
st.caption(f"{escape_markdown(ctx.ws.title)} · layer "
           f"{escape_markdown(s.layer)} · {plots.method_label(s.method)} · "
           f"{plots.REDUCTION_LABELS[s.reduce]} over each cluster")

try:  # path steps fitted to their budget: every step asked on request, at its price
    ctx = every_step_toggle(ctx, list(map(ctx.steps_plan, s.methods)), key="every_step")
except at.AttributionError:  # a method that refuses the layer: its scores say why
    pass
per_sample = guarded(lambda: {m: ctx.scores(m) for m in s.methods})
if per_sample is None:
    st.stop()
unusable = ~np.isfinite(per_sample[s.method]).all(axis=1)
if unusable.any():
    st.warning(f"{int(unusable.sum())} sample(s) have scores that are not finite (NaN or "
               "infinite), so every average over them is too: the model's own outputs or "
               "gradients overflow there. The Diagnosis page shows where.",
               icon=":material/warning:")

table = plots.cluster_table(per_sample[s.method], ctx.clusters, s.reduce)
table.index = table.index.map(ctx.cluster_label)  # once a cluster, not once a cell
tidy = plots.tidy_cluster_scores(table, s.method)
chart(plots.cluster_heatmap(tidy, method=s.method, reduce=s.reduce,
                            highlight=focus_label, one_output=ctx.regression),
      key="cluster_heatmap",
      on_click=lambda: open_clicked("cluster_heatmap"))
st.caption(f"Each cell is the cluster's {plots.REDUCTION_LABELS[s.reduce]} score for one neuron. "
           f"{plots.colour_legend(tidy['score'], s.reduce)} The framed row is the cluster in "
           "focus (sidebar). Click a cell or a bar to open that neuron.")
for method in s.methods:
    fit = ctx.fit_note(method)
    if fit is not None:
        note, usable = fit
        (st.info if usable else st.warning)(f"{plots.method_label(method)}: {note}",
                                            icon=":material/model_training:")
    planned = ctx.steps_plan(method)
    if planned is not None and (planned.reduced or planned.seconds > WORTH_SAYING_SECONDS):
        said = planned.words(plots.method_label(method))
        st.caption(escape_markdown(f"{said[:1].upper()}{said[1:]}."))
    summed = ctx.sum_finding(method)
    if summed is not None:
        message, hint = summed.words(screen=True)
        if summed.severity == "ok":
            st.caption(message)
        else:
            st.warning(f"{message} {hint}", icon=":material/functions:")

summaries = pd.concat([plots.neuron_summary(per_sample[m][ctx.focus], s.reduce, m)
                       for m in s.methods], ignore_index=True)
main = summaries[summaries["method"] == s.method]
left, right = st.columns(2, gap="medium")
with left:
    controls = st.columns([2, 1])
    most = min(40, ctx.n_neurons)
    every = most if ctx.n_neurons <= SMALL_LAYER else min(15, most)  # small layer: all
    top_n = most if most < 2 else controls[0].slider("Neurons shown", 1, most, every,
                                                     key="top_n")
    bottom = controls[1].toggle("Lowest instead", key="show_bottom")
    chart(plots.neuron_bars(main, method=s.method, reduce=s.reduce, top_n=top_n,
                            bottom=bottom, one_output=ctx.regression), key="neuron_bars",
          on_click=lambda: open_clicked("neuron_bars"))
    st.caption(f"Cluster {escape_markdown(focus_label)}: bars are the cluster score, "
               "whiskers ±1 standard deviation across its samples. Whiskers much longer than "
               "the bar mean the samples disagree.")
with right:
    samples = plots.tidy_sample_scores(per_sample[s.method][ctx.focus],
                                       ctx.focus.nonzero()[0], reduce=s.reduce)
    chart(plots.sample_heatmap(samples, method=s.method, cluster=focus_label,
                               n_total=int(ctx.focus.sum()), one_output=ctx.regression),
          key="sample_heatmap",
          on_click=lambda: open_clicked("sample_heatmap"))
    st.caption("One row per sample of the cluster, sorted by the top neuron; neurons sorted by "
               f"the cluster score ({plots.REDUCTION_LABELS[s.reduce]}). "
               f"{plots.colour_legend(samples['score'], 'mean')} Large clusters are shown by "
               "evenly spaced rows.")

if len(s.methods) > 1:
    st.subheader("Methods side by side")
    chart(plots.method_bars(summaries, reduce=s.reduce,
                            top_n=min(10, ctx.n_neurons), one_output=ctx.regression),
          key="method_bars")
    st.caption("The same cluster ranked by each method; each panel has its own units. "
               "Choose the methods under 'Compare with' in the sidebar.")

st.subheader("Score table")
wide = summaries.pivot(index="neuron", columns="method", values=["score", "spread"])
wide.columns = [f"{plots.method_label(method)} {value}" for value, method in wide.columns]
ordered = [f"{plots.method_label(m)} {v}" for m in s.methods for v in ("score", "spread")]
st.dataframe(wide[ordered].sort_values(ordered[0], ascending=False), height=300,
             width="stretch")
columns = st.columns(2)
columns[0].download_button("Download this cluster's table (CSV)",  # both made on a click
                           lambda: csv_text(summaries).encode(),
                           file_name="neuron_scores_cluster.csv", mime="text/csv",
                           on_click="ignore")
columns[1].download_button("Download every cluster (CSV)",
                           lambda: csv_text(plots.tidy_every_cluster(
                               per_sample, ctx.clusters, s.reduce)).encode(),
                           file_name="neuron_scores_all_clusters.csv", mime="text/csv",
                           on_click="ignore")

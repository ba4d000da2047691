"""Diagnosis page: are the scores degenerate, do they agree with exact ablation and with each
other, does signed averaging cancel, and does one's own gradient code match the engine?"""
import io

import numpy as np
import pandas as pd
import streamlit as st

import attribution as at
from attribution import plots
from attribution.data import load_data
from pages import common

common.require_entrypoint()

ALERTS = {"ok": st.success, "warning": st.warning, "problem": st.error}
ICONS = {"ok": ":material/check_circle:", "warning": ":material/warning:",
         "problem": ":material/error:"}

ctx = common.context()
s = ctx.settings
focus_label = ctx.cluster_label(s.cluster)
n_focus = int(ctx.focus.sum())

st.title("Diagnosis")
st.caption(f"Checks of the {plots.method_label(s.method)} scores ("
           f"{plots.REDUCTION_LABELS[s.reduce]}) on cluster "
           f"{common.escape_markdown(focus_label)} ({n_focus} samples), layer "
           f"{common.escape_markdown(s.layer)}.")

with st.expander("Check your own gradient code", icon=":material/bug_report:"):
    st.markdown(
        f"Run your code on this cluster's {n_focus} samples (download them below, in this "
        f"order) for the **{plots.method_label(s.method)}** method and the same target logit, "
        "save the per-sample scores as a NumPy array of shape [samples, neurons] with "
        "`np.save`, and upload the `.npy` file. The check compares it with the engine and "
        "names common bugs (feeding the whole batch, stale gradients).")
    inputs_file = io.BytesIO()
    np.save(inputs_file, ctx.focus_inputs().numpy())
    st.download_button("Download this cluster's inputs (.npy)", inputs_file.getvalue(),
                       file_name="cluster_inputs.npy", mime="application/octet-stream",
                       on_click="ignore")
    uploaded = st.file_uploader("Your per-sample scores (.npy)", type=["npy"],
                                key="user_scores")
user_scores, user_key = None, ""
if uploaded is not None:
    payload = uploaded.getvalue()
    try:
        user_scores, user_key = load_data(payload).inputs.numpy(), common.digest(payload)
    except at.AttributionError as error:
        common.show_error(error, before="Your scores file could not be read: ",
                          after=f" Save one array of shape [{n_focus}, {ctx.n_neurons}] "
                                "(samples x neurons) with np.save.")

st.subheader("Findings")
findings = common.guarded(lambda: ctx.findings(user_scores, user_key))
for finding in findings or []:
    text = f"**{finding.code.replace('_', ' ')}** · {common.escape_markdown(finding.message)}"
    if finding.hint:
        text += f"  \n*What to do:* {common.escape_markdown(finding.hint)}"
    ALERTS.get(finding.severity, st.info)(text, icon=ICONS.get(finding.severity))

st.subheader("Agreement with exact ablation")
st.caption("The oracle removes each neuron alone and measures the drop of the target logit. "
           "A useful score ranks neurons like the oracle (Spearman ρ near 1; random is 0). "
           "Molchanov et al. (ICLR 2017) report ρ ≈ 0.73 for Taylor (gradient × activation) "
           "and 0.56 for mean activation on VGG-16.")
methods = at.methods_for(ctx.ws.data.inputs.dtype)
oracle = common.guarded(lambda: ctx.oracle(methods))
if oracle is not None:
    shown = oracle.assign(method=oracle["method"].map(plots.method_label)).drop(columns="n")
    number = st.column_config.NumberColumn
    st.dataframe(shown, hide_index=True, width="stretch", column_config={
        "spearman_signed": number("Spearman ρ (signed)", format="%.2f"),
        "spearman_abs": number("Spearman ρ (|·|)", format="%.2f"),
        "kendall_signed": number("Kendall τ (signed)", format="%.2f"),
        "kendall_abs": number("Kendall τ (|·|)", format="%.2f"),
        "top_k_overlap_signed": number("top-k overlap (signed)", format="%.2f"),
        "top_k_overlap_abs": number("top-k overlap (|·|)", format="%.2f"),
        "top_k": number("k", format="%d")})

left, right = st.columns([3, 2], gap="medium")
with left:
    per_method = common.guarded(lambda: {m: ctx.scores(m) for m in methods})
    if per_method is not None:
        summaries = pd.concat([plots.neuron_summary(per_method[m][ctx.focus], s.reduce, m)
                               for m in methods], ignore_index=True)
        common.chart(plots.rank_correlation_heatmap(plots.rank_correlations(summaries)),
                     key="rank_correlation")
        st.caption("How alike the methods rank this cluster's neurons. Methods that agree with "
                   "each other but not with ablation share a blind spot.")
with right:
    main = ctx.scores(s.method)[ctx.focus]
    strongest = int(np.abs(main.mean(axis=0)).argmax()) if s.reduce == "mean" else \
        int(np.abs(main).mean(axis=0).argmax())
    neurons = list(range(ctx.n_neurons))
    if st.session_state.get("histogram_neuron") not in neurons:
        st.session_state["histogram_neuron"] = strongest
    neuron = st.selectbox("Neuron", neurons, key="histogram_neuron",
                          help="Starts on the neuron with the largest cluster score.")
    common.chart(plots.score_histogram(pd.DataFrame({"score": main[:, neuron]}),
                                       method=s.method, neuron=neuron), key="histogram")
    st.caption("Per-sample signed scores of one neuron. Blue and red bars of similar weight "
               "cancel in a signed mean: the average is small although single samples are "
               "not, which is why average gradients can look tiny.")

"""Diagnosis page: the verdict on the current layer, cluster and method first (with the remedies
the app can apply in one click), then the evidence: each check, the pruning curve it rests on,
agreement with exact ablation and between methods, and a check of one's own gradient code.
Long checks can be stopped (`stoppable`): the checks that had run stay on the page."""
import numpy as np
import pandas as pd
import streamlit as st

import attribution as at
from attribution.analyses.costs import seconds_words
from attribution.presentation import plots
from attribution.analyses.settings import EVIDENCE_METRIC
from attribution.analyses.verdict import (ONE_CLASS_SOURCES, check_name, check_package,
                                          cluster_composition, expected_loop,
                                          measured_changes, verdict)
from pages.shared.context import context
from pages.shared.draw import chart, escape_markdown, every_step_toggle, guarded, show_error
from pages.shared.keys import digest
from pages.shared.routing import require_entrypoint
from pages.shared.sidebar import CHOICE_KEYS, apply_choice, apply_partition

require_entrypoint()

ALERTS = {"ok": st.success, "warning": st.warning, "problem": st.error}
ICONS = {"ok": ":material/check_circle:", "warning": ":material/warning:",
         "problem": ":material/error:"}
BEFORE = "remedy_before"  # session state: the view before the last remedy, for the comparison
STOP, CONTINUE = "Stop the checks", "Run the checks again"
STOP_REMEDIES, MEASURE_REMEDIES = "Stop measuring the changes", "Measure the changes"

ctx = context()
s = ctx.settings
target_words = "output" if ctx.regression else "target logit"  # a regression head's
focus_label = ctx.cluster_label(s.cluster)
n_focus = int(ctx.focus.sum())


st.title("Diagnosis")
st.caption(f"Checks of the {plots.method_label(s.method)} scores ("
           f"{plots.REDUCTION_LABELS[s.reduce]}) on cluster "
           f"{escape_markdown(focus_label)} ({n_focus} samples), layer "
           f"{escape_markdown(s.layer)}.")
try:  # the method's path steps fitted to their budget: said, every step asked on request
    steps = ctx.steps_plan(s.method)
    ctx = every_step_toggle(ctx, [steps], key="diagnosis_every_step")
    if steps is not None and steps.reduced and not ctx.every_step:
        said = steps.words(plots.method_label(s.method))
        st.caption(escape_markdown(f"{said[:1].upper()}{said[1:]}."))
except at.AttributionError:  # a method that refuses the layer: the checks say why
    pass
try:  # a wide layer: exact ablation of a sample of its neurons, every neuron on request
    planned = ctx.diagnose_plan()
except at.AttributionError:  # a view that cannot run: the checks' own error says why
    planned = None
plan = None if planned is None else planned.oracle
if planned is not None and planned.curve.reduced:
    st.caption("The evidence curve of «not better than random» is measured "
               f"{escape_markdown(planned.curve.words(ctx.n_neurons))}.")
if plan is not None and not plan.exact:
    exact = st.toggle(f"Ablate all {plan.n_neurons:,} neurons exactly", key="oracle_exact",
                      help="The agreement with exact ablation measures "
                           f"{escape_markdown(plan.words())}, with an interval over both the "
                           "samples and the neurons drawn. On: every neuron, exactly.")
    ctx = ctx.with_exact_oracle(exact)
    if not exact:
        st.caption(f"Exact ablation measures {escape_markdown(plan.words())}.")
verdict_box = st.container()
evidence = st.container()

with st.expander("Check your own gradient code", icon=":material/bug_report:"):
    st.markdown(
        f"Download this cluster's {n_focus} samples with the class each row is scored for, "
        f"run your code for the **{plots.method_label(s.method)}** method on each row in "
        "file order, save the scores with `np.save` as an array of shape "
        f"[{n_focus}, {ctx.n_neurons}] (samples x neurons) and upload it. The check compares "
        "it with the engine and names common bugs (feeding the whole batch, stale gradients, "
        "hooks left attached). A correct loop looks like this:")
    targets, labels = ctx.focus_scored_classes(), ctx.focus_labels()
    focus_inputs = ctx.focus_inputs()
    st.code(expected_loop(ctx.layer_info, s.method, focus_inputs), language="python")
    st.download_button("Download what the check needs (.npz: inputs, targets, labels, "
                       "sample ids)",
                       check_package(focus_inputs, targets, ctx.focus.nonzero()[0],
                                     labels),
                       file_name="cluster_check.npz", mime="application/octet-stream",
                       on_click="ignore")
    uploaded = st.file_uploader("Your per-sample scores (.npy)", type=["npy"],
                                key="user_scores")
    upload_message = st.empty()

user_scores, user_key = None, ""
if uploaded is not None:
    payload = uploaded.getvalue()
    try:
        user_scores, user_key = at.load_data(payload).inputs.numpy(), digest(payload)
    except at.AttributionError as error:
        with upload_message.container():
            show_error(error, before="Your scores file could not be read: ",
                       after=f" Save one array of shape [{n_focus}, {ctx.n_neurons}] "
                             "(samples x neurons) with np.save.")


def draw_findings(findings: list) -> None:
    """One alert per finding: what it measured and, where it has one, what to do."""
    for finding in findings:
        message, hint = finding.words(screen=True)  # the sidebar's words, not the API's
        text = f"**{check_name(finding)}** · {escape_markdown(message)}"
        if hint:
            text += f"  \n*What to do:* {escape_markdown(hint)}"
        ALERTS.get(finding.severity, st.info)(text, icon=ICONS.get(finding.severity))


def checked(run, compute):
    """The findings of `compute(run)`, with a Stop button while they take a while; a
    stopped run's findings so far and a button to run the checks again, and no more."""
    if run.stopped:
        kept = run.kept or []
        with verdict_box:
            st.info(f"Stopped: the {len(kept)} checks that had run, and no verdict; the "
                    "checks run again from the start." if kept else
                    "Stopped before the first check had run.", icon=":material/stop_circle:")
            st.button(CONTINUE, on_click=run.resume, icon=":material/play_circle:")
            draw_findings(kept)
        st.stop()
    stop_slot = verdict_box.empty()
    if run.offers_stop(None if cost is None else cost.seconds):
        stop_slot.button(STOP, on_click=run.stop, icon=":material/stop_circle:",
                         help="Keeps the checks that have run, without a verdict.")
    try:
        found = compute(run)
    finally:
        stop_slot.empty()
    if found is not None:
        run.finish()
    return found


try:  # said before the checks run; a view that cannot run is the checks' own error
    cost = ctx.findings_cost()
except at.AttributionError:
    cost = None
findings = None
if user_scores is not None:
    try:
        findings = checked(ctx.findings_run(user_key),
                           lambda run: ctx.findings(user_scores, user_key, run))
    except at.AttributionError as error:  # the file's shape: said next to the uploader
        with upload_message.container():
            show_error(error, before="Your scores were not checked: ")
if findings is None:
    if cost is not None:
        verdict_box.caption(f"These checks take {escape_markdown(cost.words())}.")
    findings = checked(ctx.findings_run(), lambda run: guarded(lambda: ctx.findings(run=run)))
if findings is None:
    st.stop()

answer = verdict(findings, method=s.method, reduce=s.reduce, cluster_source=s.cluster_source,
                 has_labels=ctx.ws.data.labels is not None)
facts = {f.code: f for f in findings}


def _preview(trial) -> str:
    """What a measured remedy leads to: its verdict, the measurements before → after, and
    which samples it compares when they are not these."""
    text = f"→ *{escape_markdown(trial.after.headline)}*"
    if trial.changes:
        text += "  \n" + escape_markdown("; ".join(trial.changes))
    if trial.samples:
        samples = trial.samples[:1].upper() + trial.samples[1:]
        text += f"  \n:material/info: {escape_markdown(samples)}."
    return text


def remember_and_apply(remedy) -> None:
    """A remedy button: keep this view's verdict for the comparison, then change the choice
    (for one-class clusters, the partition and the cluster measured)."""
    key = CHOICE_KEYS[remedy.choice]
    st.session_state[BEFORE] = {"headline": answer.headline, "key": key,
                                "applied": remedy.value, "value": st.session_state.get(key),
                                "cluster": st.session_state.get("w_cluster"),
                                "findings": findings}
    if remedy.choice == "cluster_source":
        apply_partition(remedy.value, remedy.cluster)
    else:
        apply_choice(key, remedy.value)


def undo(before: dict) -> None:
    """The undo button: the choice as it was (and the cluster, for a partition change)."""
    if before["key"] == CHOICE_KEYS["cluster_source"]:
        apply_partition(before["value"], before["cluster"])
    else:
        apply_choice(before["key"], before["value"])
    st.session_state.pop(BEFORE, None)


def measured_remedies() -> tuple:
    """The verdict's remedies, each measured on the view it leads to (`tried_remedies`),
    said before with what that takes, with a Stop button while they run; stopped: none
    measured, and a button to measure them (the views measured before the stop are
    cached)."""
    run = ctx.remedies_run(answer)
    if run.stopped:
        st.caption("The changes this verdict suggests were not measured (stopped).")
        st.button(MEASURE_REMEDIES, on_click=run.resume, icon=":material/play_circle:")
        return ()
    seconds = None if run.finished or cost is None else guarded(
        lambda: ctx.remedies_cost(answer, cost.seconds))
    said, stop_slot = st.empty(), st.empty()
    offered = run.offers_stop(seconds)
    if offered and seconds is not None:  # long enough to say
        said.caption(f"Measuring the {len(answer.remedies)} changes this verdict suggests on "
                     f"the views they lead to takes {seconds_words(seconds)}.")
    if offered:
        stop_slot.button(STOP_REMEDIES, on_click=run.stop, icon=":material/stop_circle:",
                         help="Keeps the verdict; the changes are offered unmeasured.")
    try:
        tried = guarded(lambda: ctx.tried_remedies(answer, findings))
    finally:
        said.empty()
        stop_slot.empty()
    if tried is not None:
        run.finish()
    return tried or ()


with verdict_box:
    ALERTS[answer.severity](f"**{answer.headline}.** {escape_markdown(answer.explanation)}",
                            icon=ICONS[answer.severity])
    tried = measured_remedies() if answer.remedies else ()
    helpful = [t for t in tried or () if t.improves]
    if helpful:
        st.markdown(f"**What to do:** {escape_markdown(helpful[0].remedy.label)}. Each change "
                    "below was measured on the view it leads to, best first:")
        for index, trial in enumerate(helpful):
            left, right = st.columns([2, 5], vertical_alignment="center")
            left.button(trial.remedy.label, key=f"remedy_{trial.remedy.choice}_"
                        f"{trial.remedy.value}", type="primary" if index == 0 else "secondary",
                        on_click=remember_and_apply, args=(trial.remedy,), width="stretch")
            right.markdown(_preview(trial))
    elif tried:
        advice = facts[answer.cause].words(screen=True)[1] if answer.cause in facts else ""
        st.markdown("**No remedy helps here.** " + escape_markdown(advice))
        st.caption("Tried and not offered, because none improves the verdict: " + "; ".join(
            f"{escape_markdown(t.remedy.label)} → *{escape_markdown(t.after.headline)}*"
            + (f" ({escape_markdown(', '.join(t.changes))})" if t.changes else "")
            for t in tried) + ".")
    elif answer.action:
        st.markdown(f"**What to do:** {escape_markdown(answer.action)}")
    before = st.session_state.get(BEFORE)
    if before is not None and st.session_state.get(before["key"]) != before["applied"]:
        del st.session_state[BEFORE]  # changed again since: no longer the remedy's view
        before = None
    if before is not None:
        changes = measured_changes(before["findings"], findings)
        st.info(f"Before the change: *{before['headline']}*. Now: *{answer.headline}*.  \n"
                + "; ".join(changes), icon=":material/compare_arrows:")
        st.button("Undo the change", key="remedy_undo", on_click=undo, args=(before,))
    for note in answer.notes:
        st.caption(escape_markdown(note))

with evidence:
    if s.cluster_source not in ONE_CLASS_SOURCES and not ctx.regression:  # classes to mix
        classes = ctx.ws.data.labels.numpy() if ctx.ws.data.labels is not None \
            else ctx.predictions()
        mix = cluster_composition(ctx.clusters, classes, ctx.ws.class_names)
        mix = mix[mix["cluster"] == s.cluster]
        which = "true" if ctx.ws.data.labels is not None else "predicted"
        st.caption(f"Cluster {escape_markdown(focus_label)} holds {len(mix)} "
                   f"{which} classes; a mixed cluster is where signed means cancel.")
        chart(plots.class_mix_bars(mix, cluster=focus_label), key="class_mix")

    st.subheader("Evidence")
    draw_findings(findings)

    evidence_curve = getattr(facts.get("not_better_than_random"), "curve", None)
    if evidence_curve is not None:  # the curve the check measured, drawn as it is
        chart(plots.pruning_figure(
            evidence_curve.assign(subset="cluster"), n_neurons=ctx.n_neurons,
            metric=EVIDENCE_METRIC,
            titles={"cluster": f"cluster {plots.plain(focus_label)}, "
                               f"{plots.method_label(s.method)} "
                               f"({plots.REDUCTION_LABELS[s.reduce]})"},
            one_output=ctx.regression), key="diagnosis_curve")
        st.caption("The curve the 'better than random' check rests on: the cluster's "
                   f"{target_words} as its neurons are removed in the order of these scores "
                   "(orange), against random orders (grey band). A useful ranking drops "
                   "faster than the band.")

st.subheader("Agreement with exact ablation")
st.caption(f"The oracle removes each neuron alone and measures the drop of the {target_words}. "
           "A useful score ranks neurons like the oracle (Spearman ρ near 1; random is 0). "
           "Molchanov et al. (ICLR 2017) report ρ ≈ 0.73 for Taylor (gradient × activation) "
           "and 0.56 for mean activation on VGG-16.")
oracle = guarded(lambda: ctx.oracle(at.method_names()))  # every method that scores this layer
refused = {} if oracle is None else oracle.attrs.get("refused", {})
if oracle is not None:
    st.dataframe(plots.oracle_table(oracle), hide_index=True, width="stretch")
    if sampled := plots.oracle_sample_words(oracle):
        st.caption(escape_markdown(sampled))
    for method, reason in refused.items():
        st.caption(f"{plots.method_label(method)} is left out: {escape_markdown(reason)}")
methods = [m for m in at.methods_for(ctx.ws.data.inputs.dtype, ctx.layer_info.kind)
           if m not in refused]

left, right = st.columns([3, 2], gap="medium")
with left:
    per_method = guarded(lambda: {m: ctx.scores(m) for m in methods})
    if per_method is not None:
        summaries = pd.concat([plots.neuron_summary(per_method[m][ctx.focus], s.reduce, m)
                               for m in methods], ignore_index=True)
        chart(plots.rank_correlation_heatmap(plots.rank_correlations(summaries)),
              key="rank_correlation")
        st.caption("How alike the methods rank this cluster's neurons. Methods that agree with "
                   "each other but not with ablation share a blind spot.")
with right:
    main = ctx.scores(s.method)[ctx.focus]
    strongest = int(np.abs(at.reduce_scores(main, s.reduce)).argmax())
    neurons = list(range(ctx.n_neurons))
    if st.session_state.get("histogram_neuron") not in neurons:
        st.session_state["histogram_neuron"] = strongest
    neuron = st.selectbox("Neuron", neurons, key="histogram_neuron",
                          help="Starts on the neuron with the largest cluster score.")
    chart(plots.score_histogram(pd.DataFrame({"score": main[:, neuron]}),
                                method=s.method, neuron=neuron, one_output=ctx.regression),
          key="histogram")
    st.caption("Per-sample signed scores of one neuron. Blue and red bars of similar weight "
               "cancel in a signed mean: the average is small although single samples are "
               "not, which is why average gradients can look tiny.")

"""Which method to trust: every method on every layer against exact ablation (the scorecard):
rank agreement with its bootstrap interval, the damage each ranking does, and whether the
ranking survives re-initialising the layers above. Clicking a cell opens that layer and
method on the Scores page. A long scorecard can be stopped (`stoppable`): the layers measured
so far stay on the page, and Continue measures the rest."""
import streamlit as st

import attribution as at
from attribution.analyses.path_steps import layer_steps_words
from attribution.analyses.settings import SCORECARD_METHODS, partition_words, target_label
from attribution.presentation import plots
from attribution.presentation.report import csv_text
from pages.shared.context import context
from pages.shared.draw import chart, escape_markdown, every_step_toggle, guarded
from pages.shared.routing import SCORES_PAGE, require_entrypoint, switch_page
from pages.shared.sidebar import apply_choice

require_entrypoint()

OPEN_VIEW = "open_scorecard_view"  # session state: a click asked for the Scores page
STOP, CONTINUE = "Stop the scorecard", "Continue the scorecard"

if st.session_state.pop(OPEN_VIEW, False):
    switch_page(SCORES_PAGE)

ctx = context()
s = ctx.settings

st.title("Which method to trust")
st.caption(f"{escape_markdown(ctx.ws.title)} · every layer · clusters: "
           f"{escape_markdown(partition_words(s.cluster_source, s.k, s.layer, ctx.regression))}"
           f" · scored for the {escape_markdown(target_label(s.target, ctx.regression))}")
target_words = "output" if ctx.regression else "target logit"  # a regression head's
st.markdown(
    "Each method's cluster scores (signed mean) against **exact ablation**, which removes "
    f"each neuron alone and measures the drop of the {target_words}: Spearman ρ per cluster, "
    "averaged over clusters (1 = ranks neurons as the oracle does, 0 = as random). Hover a "
    "cell for its 95% bootstrap interval, Kendall τ, top-10% overlap and how much of the "
    "oracle's pruning damage its ranking does. On the right, the same ranking after the "
    "layers above are re-initialised: a ranking that stays near 1 there does not read the "
    "model (Adebayo et al. 2018), as activation never can.")

every = st.toggle("Every method the layers take", key="scorecard_every",
                  help="The seven default methods, or every method (the pruning criteria, "
                       "DeepLift, LRP, the probe), which takes longer. A method that cannot "
                       "score a layer leaves its cell empty.")
methods = at.method_names() if every else SCORECARD_METHODS
try:  # wide layers: exact ablation of a sample of their neurons, every neuron on request
    sampled = {layer: plan for layer, plan in ctx.scorecard_oracle_plans().items()
               if not plan.exact}
except at.AttributionError:  # a view that cannot run: the scorecard's own error says why
    sampled = {}
if sampled:
    exact = st.toggle("Ablate every neuron of every layer exactly", key="scorecard_exact",
                      help="Exact ablation measures, on " + "; ".join(
                          f"{escape_markdown(layer)}, {escape_markdown(plan.words())}"
                          for layer, plan in sampled.items())
                      + ". On: every neuron, exactly.")
    ctx = ctx.with_exact_oracle(exact)
try:  # path steps fitted to their budget on each layer: every step asked on request,
    ctx = every_step_toggle(ctx, list(ctx.scorecard_steps(methods).values()),  # priced for
                            key="scorecard_every_step", copies=2,  # the model and its
                            where=" on every layer")  # randomised copy
except at.AttributionError:  # a view that cannot run: the scorecard's own error says why
    pass
try:  # said before the scorecard runs; a view that cannot run is the scorecard's own error
    cost = ctx.scorecard_cost(methods)
    st.caption(f"The scorecard takes {escape_markdown(cost.words())}.")
    if fewer := layer_steps_words(ctx.scorecard_steps(methods), plots.method_label):
        st.caption(escape_markdown(f"{fewer[:1].upper()}{fewer[1:]}."))
except at.AttributionError:
    cost = None
run = ctx.scorecard_run(methods)
if run.stopped:  # what was measured before the stop, and the way on
    kept = run.kept
    done = [] if kept is None else kept.attrs["layers_done"]
    st.info(f"Stopped: the scorecard shows the {len(done)} of {len(ctx.ws.layers)} layers "
            "measured before the stop." if done else
            "Stopped before the first layer was measured.", icon=":material/stop_circle:")
    st.button(CONTINUE, on_click=run.resume, icon=":material/play_circle:")
    card = None if not done else kept[kept["layer"].isin(done)]
    if card is not None:  # the refusals of the layers shown
        card.attrs["refused"] = {key: reason for key, reason in kept.attrs["refused"].items()
                                 if key.rsplit("/", 1)[0] in done}
else:
    stop_slot = st.empty()
    if run.offers_stop(None if cost is None else cost.seconds):
        stop_slot.button(STOP, on_click=run.stop, icon=":material/stop_circle:",
                         help="Keeps the layers measured so far; Continue measures the rest.")
    card = guarded(lambda: ctx.scorecard(methods, run))
    stop_slot.empty()
    if card is not None:
        run.finish()
if card is None:
    st.stop()


def open_clicked() -> None:
    """A click on a cell (callback): that layer and method, then the Scores page."""
    by_label = {(plots.plain(layer), plots.method_label(method)): (layer, method)
                for layer, method in zip(card["layer"], card["method"])}
    for point in st.session_state["scorecard"]["selection"]["points"]:
        chosen = by_label.get((point.get("y"), point.get("x")))
        if chosen is not None:
            apply_choice("w_layer", chosen[0].split(":")[0])
            apply_choice("w_method", chosen[1])
            st.session_state[OPEN_VIEW] = True
            return


chart(plots.scorecard_figure(card), key="scorecard", on_click=open_clicked)
if sampled := plots.oracle_sample_words(card):
    st.caption(escape_markdown(sampled))
ranked = card[(card["method"] != "ablation") & card["spearman"].notna()]  # a 1-neuron layer:
best = card.loc[ranked.groupby("layer", sort=False)["spearman"].idxmax()]  # no ranking at all
st.caption("Best after the oracle itself, per layer: " + "; ".join(
    f"{escape_markdown(row.layer)}: {plots.method_label(row.method)} (ρ {row.spearman:.2f})"
    for row in best.itertuples()) + ".")
for key, reason in card.attrs.get("refused", {}).items():
    layer, method = key.rsplit("/", 1)
    st.caption(f"{plots.method_label(method)} on {escape_markdown(layer)} is left out: "
               f"{escape_markdown(reason)}")
st.dataframe(plots.scorecard_table(card), hide_index=True, width="stretch")
st.download_button("Download the scorecard (.csv)", csv_text(card).encode("utf-8"),
                   file_name="scorecard.csv", mime="text/csv", on_click="ignore")

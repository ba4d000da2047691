"""Neuron page: one neuron of the layer up close. How much it matters for the cluster (its
per-sample scores there and elsewhere, what removing it alone does) joined with what it
responds to (its activations, and the samples that drive it most and least, drawn as what
they are). Opened by clicking a bar or heatmap cell on the Scores page, or by a link."""
import streamlit as st

from attribution.presentation import plots
from attribution.presentation.report import sample_shape
from attribution.analyses.neuron import neuron_view
from attribution.analyses.settings import cluster_label
from pages.shared.context import context
from pages.shared.draw import chart, escape_markdown, guarded
from pages.shared.progress import ProgressLine
from pages.shared.routing import NEURON_CHOICE, require_entrypoint
from pages.shared.url import url_choice

require_entrypoint()

EXAMPLES = 8  # samples shown on each side (most, least)

ctx = context()
s = ctx.settings
focus_label = ctx.cluster_label(s.cluster)


@st.cache_data(max_entries=32, show_spinner="Opening the neuron…")
def view_of(key: tuple, neuron: int, _model, layer: str, _inputs, _targets, _scores,
            _activations, _focus, _labels, method: str, _tokens, image_shape, batch_size: int,
            _progress):
    with _progress:  # entered in the cached call: a cache hit replays no line
        return neuron_view(_model, layer, _inputs, _targets, _scores, _activations, _focus,
                           neuron, labels=_labels, n_examples=EXAMPLES, method=method,
                           tokens=_tokens, image_shape=image_shape, batch_size=batch_size,
                           progress=_progress)


def keep_choice() -> None:
    st.session_state[NEURON_CHOICE] = st.session_state["w_neuron"]


per_sample = guarded(lambda: (ctx.scores(s.method), ctx.scores("activation")))
if per_sample is None:
    st.stop()
scores, activations = per_sample
summary = plots.neuron_summary(scores[ctx.focus], s.reduce, s.method)
neurons = list(range(ctx.n_neurons))
wanted = url_choice("w_neuron")
if wanted is not None and wanted.isdigit():
    st.session_state[NEURON_CHOICE] = int(wanted)
if st.session_state.get(NEURON_CHOICE) not in neurons:  # the cluster's top neuron
    st.session_state[NEURON_CHOICE] = int(summary["score"].idxmax())
st.session_state["w_neuron"] = st.session_state[NEURON_CHOICE]

ranks = summary["score"].rank(ascending=False, method="min").astype(int)
st.title(f"Neuron {st.session_state['w_neuron']} of {escape_markdown(s.layer)}")
top = st.columns([1, 3])
neuron = top[0].selectbox(
    "Neuron", neurons, key="w_neuron", on_change=keep_choice,
    format_func=lambda n: f"{n} · rank {ranks[n]} of {len(neurons)}",
    help="Ranked by the cluster score; click a bar or heatmap cell on the Scores page to "
         "open another.")
st.query_params["neuron"] = str(neuron)  # part of the shared link while this page is shown
top[1].caption(f"{escape_markdown(ctx.ws.title)} · {plots.method_label(s.method)} · "
               f"{plots.REDUCTION_LABELS[s.reduce]} over cluster "
               f"{escape_markdown(focus_label)} ({int(ctx.focus.sum())} samples)")

labels = ctx.ws.data.labels
view = guarded(lambda: view_of(
    (ctx.ws.key, s.layer, s.method, ctx.target_key, ctx.cluster_key), neuron, ctx.ws.model,
    s.layer, ctx.ws.data.inputs, ctx.targets, scores, activations, ctx.focus, labels,
    s.method, ctx.ws.data.tokens, ctx.ws.data.image_shape, s.batch_size,
    ProgressLine(f"Opening neuron {neuron} (removing it from every sample)")))
if view is None:
    st.stop()

removal = view.removal.set_index(["metric", "subset"])
metrics = st.columns(4)
metrics[0].metric("Score in the cluster",
                  f"{summary['score'][neuron]:.3g}",
                  help=f"{plots.REDUCTION_LABELS[s.reduce].capitalize()} over cluster "
                       f"{escape_markdown(focus_label)}: rank {ranks[neuron]} of "
                       f"{len(neurons)}; ± {summary['spread'][neuron]:.3g} across its samples.",
                  border=True)
TILES = (("squared_error", "cluster", "Cluster squared error"),  # a regression head's
         ("squared_error", "rest", "Rest squared error"),
         ("target_logit", "cluster", "Cluster output")) if ctx.regression else (
        ("accuracy", "cluster", "Cluster accuracy"), ("accuracy", "rest", "Rest accuracy"),
        ("target_logit", "cluster", "Cluster logit"))
for column, (metric, subset, words) in zip(metrics[1:], TILES):
    if (metric, subset) not in removal.index:
        continue
    row = removal.loc[(metric, subset)]
    shown = (f"{row['removed']:.1%}", f"{row['change'] * 100:+.1f} pp") \
        if metric == "accuracy" else (f"{row['removed']:.3g}", f"{row['change']:+.3g}")
    column.metric(f"{words} without it", shown[0], shown[1], border=True,
                  help="Its output set to 0 alone (zero ablation). The logit is the scored "
                       "class's; the change is against the intact model"
                       + plots.change_interval_words(row, metric) + ".")

has_positions = bool(ctx.layer_info.positions)
chart(plots.neuron_distributions(view.samples, method=s.method, neuron=neuron,
                                 cluster=focus_label, positions=has_positions,
                                 one_output=ctx.regression),
      key="neuron_distributions")
averaged = ", averaged over positions" if has_positions else ""
st.caption("Left: how much the neuron matters for each sample (its score) in the cluster and "
           f"in the rest of the data. Right: how strongly it fires (its output{averaged}). "
           "A neuron that fires everywhere but matters only in the cluster is specific to it "
           "through what follows, not through what it detects.")

examples = view.examples.assign(label_name=[
    "" if label is None else f"{label:.3g}" if isinstance(label, float)
    else cluster_label(label, "label", ctx.ws.class_names)
    for label in view.examples["label"]])
st.subheader("The samples that drive it most and least")
if view.input_kind == "image":
    chart(plots.example_images(examples, neuron=neuron), key="neuron_examples")
    st.caption("Each image: the sample's number in the data, its label and the neuron's "
               "activation. " + ("The colour over each image is the channel's output at each "
                                 "position: where in the image it responds." if
                                 examples["positions"].iloc[0] is not None else ""))
elif view.input_kind in ("table", "tokens"):
    chart(plots.example_values(examples, neuron=neuron, method=s.method,
                               feature_names=ctx.ws.data.feature_names,
                               one_output=ctx.regression),
          key="neuron_examples")
    st.caption(("Each sample's tokens, coloured by the neuron's "
                + (f"{plots.method_label(s.method)} score at each token (they add up to the "
                   "sample's score)" if examples["token_scores"].notna().all() else
                   "output at each position") + ".") if
               view.input_kind == "tokens" else
               "Each row is a sample (most-activating first), each column an input feature.")
else:
    st.info(f"Inputs of shape {sample_shape(ctx.ws.data.inputs)} are not drawn; the table "
            "below lists the samples.", icon=":material/info:")
st.dataframe(examples[["side", "sample", "activation", "score", "in_cluster", "label_name"]]
             .rename(columns={"side": "drives it", "label_name": "label",
                              "in_cluster": "in the cluster"}),
             hide_index=True, width="stretch")

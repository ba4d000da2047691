"""Pruning page: live top-k vs bottom-k vs random curves for the cluster in focus and for the
rest of the data, drawn while they compute, with a stop button and a summary in words. What
it shows follows the curve's state (`pages.shared.curve_states`: new, computing, stopped,
failed, complete, or resumable from points kept).

No work is thrown away: the points of each curve are kept per curve key as they arrive, so a
curve left mid-way (another page, a stop, a closed tab's rerun) resumes from them. A curve
cut off by the toolbar's Stop (which freezes the run's progress bar and stop button on the
page) is shown as stopped within a second, like one stopped by this page's own button."""
import time

import streamlit as st

import attribution as at
from attribution.analyses.costs import seconds_words
from attribution.presentation import plots
from attribution.progress import TimeLeft
from attribution.presentation.report import curve_sentences
from pages.shared.context import context
from pages.shared.curve_states import TO_COMPUTE, PruningCurve, State, progress_words
from pages.shared.draw import chart, escape_markdown, guarded, show_error
from pages.shared.routing import require_entrypoint
from attribution.analyses.settings import RANDOM_ORDERS, metric_label
from pages.shared.sidebar import draw_setting, metric_options, page_widget

require_entrypoint()

REDRAW_SECONDS = 0.15  # at most this often while computing (the first points always at once)
STOP_WATCH_SECONDS = 1.0  # how soon a toolbar Stop's frozen progress bar is replaced
PRUNED_FILE = "pruned_file"  # session state: ((curve key, k), the .pt2's bytes) last made
NOTE_SHOWN = "pruning_note_shown"  # session state: the curve key whose "Complete." is due
NOTE_TICKS = "pruning_note_ticks"  # session state: calls of the note's fragment this curve
NOTE_AFTER_SECONDS = 0.3  # the browser's tick after a finished curve's chart
FINISHED_CHART = "pruning_chart"  # the key of the chart of every finished curve

ctx = context()
s = ctx.settings
focus_label = ctx.cluster_label(s.cluster)

st.title("Pruning curves")
st.caption("Remove the layer's neurons one by one in the order of their scores and watch the "
           "model: if the scores mean anything, removing the highest-scored neurons first "
           "(orange) hurts more than removing them in random order (grey band), and removing "
           "the lowest-scored first (blue) hurts least.")

controls = st.columns([1, 1, 2])
metrics, default_metric = metric_options(ctx.ws)
page_widget("w_metric", metrics, default_metric)
draw_setting(controls[0], "metric", metrics, ctx.regression)
page_widget("w_random")
draw_setting(controls[1], "n_random", RANDOM_ORDERS)
titles = {"cluster": f"cluster {plots.plain(focus_label)}", "rest": "rest of the data"}
n_neurons = ctx.n_neurons
try:  # a wide layer: the curve sized to its budget, the full one on request
    sized = ctx.curve_plan()
except at.AttributionError:  # a layer that cannot run: the curve's own error below
    sized = None
sizing = st.empty()  # the toggle's place, held in every run whether or not it is drawn: what
# follows keeps its place, so a run's chart replaces the last run's instead of standing beside it
if sized is not None and sized.reduced:
    full = sizing.toggle(f"Every k on every sample ({seconds_words(sized.full_seconds)})",
                         key="curve_full",
                         help="Off: as many values of k and samples as fit the curve's time "
                              "budget, the random orders all kept. On: every value of k the "
                              "layer's width gives, on every sample.")
    ctx = ctx.with_full_curve(full)
    if not full:
        controls[2].caption("This curve is sized to its budget: "
                            f"{escape_markdown(sized.words(n_neurons))}.")
if sized is None or not sized.reduced or ctx.full_curve:
    try:  # said before the curve runs; a layer that cannot run is the curve's own error below
        controls[2].caption(f"This curve costs {ctx.curve_cost().words()}")
    except at.AttributionError:
        pass
curve = PruningCurve(st.session_state, ctx.curve_key())
view = curve.view(len(ctx.curve_ks()))
status, stop_slot = st.empty(), st.empty()  # the same places in every state, then the chart
chart_slot = st.empty() if view.state in TO_COMPUTE else None


@st.fragment(run_every=STOP_WATCH_SECONDS)
def watch_for_a_toolbar_stop() -> None:
    """Ticks only between runs: a tick that arrives during a run waits for its end. A curve
    still marked as running then lost its run to the toolbar's Stop, which leaves that run's
    progress bar and stop button frozen: `curve.watch` records the stop, and the page is
    redrawn as stopped. Every other end of a computing run starts a new full run, which ends
    these ticks."""
    if curve.watch():
        st.rerun(scope="app")


def curve_chart(curves, key: str = FINISHED_CHART) -> None:
    """The curves' chart, in the place after the progress line and stop button in every
    state. The finished view draws it with FINISHED_CHART, and so does a computing run's last
    draw: the same figure under the same key at the same place is the same element, so the
    next run's finished view leaves the drawn chart as it is. Only a computing run holds the
    place with an st.empty (a new run's placeholder would first blank what is there)."""
    figure = plots.pruning_figure(curves, n_neurons=n_neurons, metric=s.metric, titles=titles,
                                  one_output=ctx.regression)
    if chart_slot is None:
        chart(figure, key=key)
        return
    with chart_slot:
        chart(figure, key=key)


def show(curves, note: str) -> None:
    curve_chart(curves)
    st.caption(note)


def show_finished(curves, note: str) -> None:
    """The finished curve, and "Complete." under it once the browser has drawn it. A run's
    last draw sends a new chart (its points changed), which the browser mounts and plots in
    its own time; under CPU load the rest of the finished run's elements arrived first, and
    the page read "Complete." above no curve. The first time a curve is shown finished, the
    note comes from a fragment tick instead: the browser's own timer, which runs after its
    script has plotted what came before; the tick marks the note due and redraws the page,
    whose identical chart stays as drawn."""
    curve_chart(curves)
    key = ctx.curve_key()
    if st.session_state.get(NOTE_SHOWN) == key:
        st.caption(note)
        return
    st.session_state[NOTE_TICKS] = 0

    @st.fragment(run_every=NOTE_AFTER_SECONDS)
    def after_the_chart() -> None:
        ticks = st.session_state[NOTE_TICKS] = st.session_state.get(NOTE_TICKS, 0) + 1
        if ticks > 1:  # a tick of the browser's timer, not the call in the full run
            st.session_state[NOTE_SHOWN] = key
            st.rerun(scope="app")

    after_the_chart()


def summarise(curves, heading: str) -> None:
    summary = at.curve_summary(curves)
    st.subheader(heading)
    for sentence in curve_sentences(summary, metric=s.metric, method=s.method,
                                    cluster=focus_label, sizes=curves.attrs.get("n_samples"),
                                    n_random=s.n_random):
        st.markdown(escape_markdown(sentence))
    st.dataframe(plots.curve_summary_table(summary, metric=s.metric), hide_index=True,
                 width="stretch")
    st.caption("'Mean over k' is the area under each curve divided by the number of neurons: "
               "the metric averaged over every amount of pruning. The gap is positive when the "
               "ranking does more damage than random.")


def take_away(curves) -> None:
    """Choose k on the curve and download the model with the k lowest-ranked neurons
    removed; the file is made on request and kept for that curve and k."""
    st.subheader("Take the pruned model away")
    ks = sorted(int(k) for k in curves["k"].unique())
    k = st.select_slider("Neurons to remove, lowest-ranked first", ks,
                         value=ks[len(ks) // 2], key=f"prune_k_{n_neurons}")
    at_k = curves[curves["k"] == k]
    shown = "{:.1%}" if s.metric == "accuracy" else "{:.3g}"
    measured = ", ".join(f"{titles.get(row.get('subset'), 'all')} "
                         f"{shown.format(row['bottom'])}" for _, row in at_k.iterrows())
    st.caption(escape_markdown(  # cluster names come from the data
        f"{metric_label(s.metric, ctx.regression).capitalize()} with these {k} neurons of "
        f"{s.layer} removed (the blue curve at k = {k}): {measured}. The file is a "
        "torch.export .pt2 that loads here and in PyTorch (torch.export.load)."))
    for subset, check in at.curve_checks(curves, k).items():
        if check.warning:
            st.warning(escape_markdown(
                f"{titles.get(subset, 'All data').capitalize()}: {check.warning} Rank by mean "
                "magnitude (Reduction: mean |·| in the sidebar) or by exact ablation."),
                icon=":material/warning:")
    wanted = (ctx.curve_key(), k)
    kept = st.session_state.get(PRUNED_FILE)
    if kept is None or kept[0] != wanted:
        if not st.button(f"Prepare the model with the {k} lowest-ranked neurons removed",
                         icon=":material/content_cut:"):
            return
        with st.spinner("Pruning and exporting the model…"):
            data = guarded(lambda: ctx.pruned_model_file(k))
        if data is None:
            return
        kept = st.session_state[PRUNED_FILE] = (wanted, data)
    st.download_button(f"Download this model with the {k} lowest-ranked neurons removed",
                       kept[1], file_name=f"{s.layer.replace(':', '_')}-pruned-{k}.pt2",
                       mime="application/octet-stream", icon=":material/download:",
                       type="primary")


if view.state is State.COMPLETE:
    show_finished(view.points, view.note)
    summarise(view.points, view.summary)
    take_away(view.points)
elif view.state is State.STOPPED:
    if view.points is not None:
        show(view.points, view.note)
        summarise(view.points, view.summary)
    else:
        st.info(view.note)
    if st.button(view.button, type="primary", icon=":material/play_arrow:"):
        curve.resume()
        st.rerun()
elif view.state is State.FAILED:
    show_error(view.error)
    if st.button(view.button, icon=":material/refresh:"):
        curve.retry()
        st.rerun()
else:
    assert view.state in TO_COMPUTE, view.state
    scores = guarded(lambda: ctx.scores(s.method))
    if scores is None:
        st.stop()
    start_fraction, start_words = view.progress
    bar = status.progress(start_fraction, text=start_words)
    stop_slot.button(view.button, on_click=curve.stop, icon=":material/stop_circle:")
    if view.points is not None:  # the points kept: shown at once
        curve_chart(view.points, key="partial_curve_resumed")
    last_draw, n_draws, drew_finished = [0.0], [0], [False]
    time_left = TimeLeft(start_fraction)  # measured from where this run computes

    def on_progress(fraction, partial) -> None:
        curve.progress(partial)  # first: a rerun or stop may end the run at any call
        bar.progress(fraction, text=progress_words(fraction, time_left.words(fraction)))
        now = time.monotonic()
        if now - last_draw[0] >= REDRAW_SECONDS or fraction >= 1.0:
            last_draw[0], n_draws[0] = now, n_draws[0] + 1
            finished = fraction >= 1.0 and not drew_finished[0]
            drew_finished[0] = drew_finished[0] or finished
            # a key per draw (two draws may show equal points); the last is the finished one
            curve_chart(partial, FINISHED_CHART if finished else f"partial_curve_{n_draws[0]}")

    # the toolbar-stop watch starts inside `run` while nothing is marked (it only ticks then)
    curve.run(lambda resume: ctx.pruning_curves(progress=on_progress, resume=resume),
              watch=watch_for_a_toolbar_stop, restarted=time_left.restart)
    st.rerun()  # the finished (or failed) view above, drawn by one code path: its chart is
    # the one the last draw sent (same key, figure and place), so it stays drawn

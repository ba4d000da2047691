"""Pruning page: live top-k vs bottom-k vs random curves for the cluster in focus and for the
rest of the data, drawn while they compute, with a stop button and a summary in words.

No work is thrown away: the points of each curve are kept per curve key as they arrive, so a
curve left mid-way (another page, a stop, a closed tab's rerun) resumes from them. A curve
cut off by the toolbar's Stop (which freezes the run's progress bar and stop button on the
page) is shown as stopped within a second, like one stopped by this page's own button."""
import time

import streamlit as st

import attribution as at
from attribution.presentation import plots
from attribution.progress import TimeLeft
from attribution.presentation.report import curve_sentences
from pages.shared.context import context
from pages.shared.draw import chart, escape_markdown, guarded, show_error
from pages.shared.routing import require_entrypoint
from pages.shared.sidebar import METRIC_LABELS, RANDOM_ORDERS, page_widget

require_entrypoint()

REDRAW_SECONDS = 0.15  # at most this often while computing (the first points always at once)
MAX_KEPT_CURVES = 16  # finished (and, separately, unfinished) curves kept per session
STOP_WATCH_SECONDS = 1.0  # how soon a toolbar Stop's frozen progress bar is replaced

ctx = context()
s = ctx.settings
focus_label = ctx.cluster_label(s.cluster)

st.title("Pruning curves")
st.caption("Remove the layer's neurons one by one in the order of their scores and watch the "
           "model: if the scores mean anything, removing the highest-scored neurons first "
           "(orange) hurts more than removing them in random order (grey band), and removing "
           "the lowest-scored first (blue) hurts least.")

controls = st.columns([1, 1, 2])
page_widget("w_metric")
controls[0].selectbox("Measure", list(METRIC_LABELS), key="w_metric",
                      format_func=METRIC_LABELS.get)
page_widget("w_random")
controls[1].select_slider("Random orders", list(RANDOM_ORDERS), key="w_random",
                          help="More orders give a smoother band and take longer.")
titles = {"cluster": f"cluster {plots.plain(focus_label)}", "rest": "rest of the data"}
n_neurons = ctx.n_neurons
key = ctx.curve_key()
finished = st.session_state.setdefault("curves", {})
stopped = st.session_state.setdefault("stopped_curves", {})
partials = st.session_state.setdefault("partial_curves", {})  # key -> points computed so far
failed = st.session_state.setdefault("failed_curves", {})  # key -> the AttributionError
running = st.session_state.setdefault("running_curves", set())  # keys a run is computing


def keep(store: dict, curve_key: tuple, value) -> None:
    """Store `value` under `curve_key`, dropping the oldest beyond MAX_KEPT_CURVES."""
    store.pop(curve_key, None)
    while len(store) >= MAX_KEPT_CURVES:
        store.pop(next(iter(store)))
    store[curve_key] = value


def stop() -> None:
    stopped[key] = partials.get(key)
    running.discard(key)


@st.fragment(run_every=STOP_WATCH_SECONDS)
def watch_for_a_toolbar_stop() -> None:
    """Ticks only between runs: a tick that arrives during a run waits for its end. A curve
    still marked as running then lost its run to the toolbar's Stop, which leaves that run's
    progress bar and stop button frozen: record the stop and redraw the page as stopped. Every
    other end of a computing run starts a new full run, which ends these ticks."""
    if key in running:
        stop()
        st.rerun(scope="app")


def show(curves, note: str) -> None:
    chart(plots.pruning_figure(curves, n_neurons=n_neurons, metric=s.metric,
                               titles=titles), key="pruning_chart")
    st.caption(note)


def summarise(curves, so_far: bool = False) -> None:
    summary = at.curve_summary(curves)
    st.subheader("In words, from the points computed so far" if so_far else "In words")
    for sentence in curve_sentences(summary, metric=s.metric, method=s.method,
                                    cluster=focus_label, sizes=curves.attrs.get("n_samples"),
                                    n_random=s.n_random):
        st.markdown(escape_markdown(sentence))
    st.dataframe(plots.curve_summary_table(summary, metric=s.metric), hide_index=True,
                 width="stretch")
    st.caption("'Mean over k' is the area under each curve divided by the number of neurons: "
               "the metric averaged over every amount of pruning. The gap is positive when the "
               "ranking does more damage than random.")


if key in finished:
    show(finished[key], "Complete. Change the cluster, method or settings to compute again.")
    summarise(finished[key])
elif key in stopped:
    if stopped[key] is not None:
        done, total = stopped[key]["k"].nunique(), len(s.curve_ks(n_neurons))
        show(stopped[key], f"Stopped: the curve shows the {done} of {total} k values computed "
                           "before the stop; continuing computes only the rest.")
        summarise(stopped[key], so_far=True)
    else:
        st.info("Stopped before the first points.")
    if st.button("Continue the curve", type="primary", icon=":material/play_arrow:"):
        del stopped[key]
        st.rerun()
elif key in failed:
    show_error(failed[key])
    if st.button("Try again", icon=":material/refresh:"):
        del failed[key]
        st.rerun()
else:
    scores = guarded(lambda: ctx.scores(s.method))
    if scores is None:
        st.stop()
    ks = s.curve_ks(n_neurons)
    resume = partials.get(key)
    status = st.empty()
    start_fraction = 0.0 if resume is None else resume["k"].nunique() / len(ks)
    bar = status.progress(start_fraction, text="Computing the first points…" if resume is None
                          else f"Resuming from the {start_fraction:.0%} of the k values "
                               "computed before…")
    stop_slot = st.empty()
    stop_slot.button("Stop the curve", on_click=stop, icon=":material/stop_circle:")
    chart_slot = st.empty()
    if resume is not None:
        with chart_slot.container():
            chart(plots.pruning_figure(resume, n_neurons=n_neurons, metric=s.metric,
                                       titles=titles), key="partial_curve_resumed")
    last_draw, n_draws = [0.0], [0]
    time_left = TimeLeft(start_fraction)  # measured from where this run computes

    def on_progress(fraction, partial) -> None:
        keep(partials, key, partial)  # first: a rerun or stop may end the run at any call
        words = time_left.words(fraction)
        estimate = f" · {words} (estimated from the points so far)" if words else ""
        bar.progress(fraction, text=f"{fraction:.0%} of the k values computed{estimate}")
        now = time.monotonic()
        if now - last_draw[0] >= REDRAW_SECONDS or fraction >= 1.0:
            last_draw[0], n_draws[0] = now, n_draws[0] + 1
            with chart_slot.container():  # a key per draw: two draws may show equal points
                chart(plots.pruning_figure(partial, n_neurons=n_neurons,
                                           metric=s.metric, titles=titles),
                      key=f"partial_curve_{n_draws[0]}")

    def compute(resume_from):
        return ctx.pruning_curves(progress=on_progress, resume=resume_from)

    def compute_resuming():
        try:
            return compute(resume)
        except at.AttributionError:
            if resume is None:
                raise
            time_left.restart()  # the kept points do not fit (e.g. other data): from the start
            return compute(None)

    running.discard(key)  # left marked by a run that a rerun cut off (a choice, another page)
    watch_for_a_toolbar_stop()  # here it only starts the ticks: nothing is marked yet
    running.add(key)
    try:
        curves = compute_resuming()
    except at.AttributionError as error:
        keep(failed, key, error)
    except Exception:
        running.discard(key)  # a crash shows as one, never as a stop
        raise
    else:
        partials.pop(key, None)
        keep(finished, key, curves)
    running.discard(key)
    st.rerun()  # the finished (or failed) view above, drawn by one code path

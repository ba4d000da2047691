"""The Pruning page's state machine (pages/shared/curve_states.py), driven directly: every
state, every transition and what each state shows, without a browser or AppTest."""
import pandas as pd
import pytest

from attribution.errors import AttributionError
from pages.shared.curve_states import (CONTINUE, MAX_KEPT_CURVES, STOP, TO_COMPUTE, TRY_AGAIN,
                                       PruningCurve, State, keep, progress_words)

KEY = ("demo:digits_mlp", "relu2", "gradient", "true", "label:8:relu2:0", "mean", "accuracy",
       20, 256)
N_KS = 8


def points(*ks: int) -> pd.DataFrame:
    """Curve points for the k values `ks` (two rows each, as the curves have several
    subsets and orders)."""
    return pd.DataFrame({"k": [k for k in ks for _ in range(2)], "value": 0.5})


class Rerun(BaseException):
    """Streamlit's control flow (RerunException, StopException): no Exception."""


@pytest.fixture
def session() -> dict:
    return {}


@pytest.fixture
def curve(session) -> PruningCurve:
    return PruningCurve(session, KEY)


def computing(curve: PruningCurve, *ks: int) -> PruningCurve:
    """`curve` COMPUTING with the points of `ks` arrived."""
    curve.start()
    if ks:
        curve.progress(points(*ks))
    return curve


def cut_off(curve: PruningCurve, *ks: int) -> PruningCurve:
    """`curve` after a run that a rerun ended when the points of `ks` had arrived."""
    def compute(resume):
        if ks:
            curve.progress(points(*ks))
        raise Rerun()

    with pytest.raises(Rerun):
        curve.run(compute)
    return curve


# ------------------------------------------------------------------ the stores

def test_the_state_lives_in_the_session_under_the_keys_the_page_always_used(session, curve):
    assert set(session) == {"curves", "stopped_curves", "partial_curves", "failed_curves",
                            "running_curves"}
    computing(curve, 1)
    assert session["running_curves"] == {KEY}
    assert session["partial_curves"][KEY]["k"].tolist() == [1, 1]
    again = PruningCurve(session, KEY)  # the next run of the page: the same curve
    assert again.state is State.COMPUTING and again.kept is curve.kept


def test_curves_of_other_keys_are_independent(session, curve):
    other = PruningCurve(session, KEY[:-1] + (64,))  # another batch size
    computing(curve, 1).finish(points(1, 2))
    assert curve.state is State.COMPLETE and other.state is State.NEW
    computing(other, 1).stop()
    assert curve.state is State.COMPLETE and other.state is State.STOPPED


def test_each_store_keeps_the_latest_curves_only():
    store = {}
    for index in range(MAX_KEPT_CURVES + 3):
        keep(store, index, index)
    assert list(store) == list(range(3, MAX_KEPT_CURVES + 3))
    keep(store, 5, "again")  # kept again: now the newest
    assert list(store)[-1] == 5 and len(store) == MAX_KEPT_CURVES


def test_finished_curves_beyond_the_limit_are_dropped_oldest_first(session):
    for batch in range(MAX_KEPT_CURVES + 1):
        computing(PruningCurve(session, KEY + (batch,)), 1).finish(points(1))
    assert PruningCurve(session, KEY + (0,)).state is State.NEW
    assert PruningCurve(session, KEY + (1,)).state is State.COMPLETE


# ------------------------------------------------------------------ states and what they show

def test_a_new_curve_computes_from_the_first_points(curve):
    view = curve.view(N_KS)
    assert view.state is State.NEW and view.state in TO_COMPUTE
    assert view.points is None and view.summary is None and view.error is None
    assert view.progress == (0.0, "Computing the first points…")
    assert view.button == STOP


def test_a_computing_curve_shows_its_kept_points_and_where_it_resumes(curve):
    computing(curve, 1, 2)
    view = curve.view(N_KS)
    assert view.state is State.COMPUTING and view.state in TO_COMPUTE
    assert view.points is curve.kept
    assert view.progress == (0.25, "Resuming from the 25% of the k values computed before…")
    assert view.button == STOP


def test_a_computing_curve_without_points_yet_starts_from_the_first(curve):
    computing(curve)
    assert curve.view(N_KS).progress == (0.0, "Computing the first points…")


def test_a_complete_curve_shows_the_curves_and_their_summary(curve):
    finished = points(*range(N_KS))
    computing(curve, 1).finish(finished)
    view = curve.view(N_KS)
    assert view.state is State.COMPLETE and view.state not in TO_COMPUTE
    assert view.points is finished
    assert view.note == "Complete. Change the cluster, method or settings to compute again."
    assert view.summary == "In words" and view.button is None and view.progress is None


def test_a_stopped_curve_shows_the_points_so_far_and_offers_to_continue(curve):
    computing(curve, 1, 2, 3).stop()
    view = curve.view(N_KS)
    assert view.state is State.STOPPED and view.state not in TO_COMPUTE
    assert view.points["k"].nunique() == 3
    assert view.note == ("Stopped: the curve shows the 3 of 8 k values computed before the "
                         "stop; continuing computes only the rest.")
    assert view.summary == "In words, from the points computed so far"
    assert view.button == CONTINUE


def test_a_curve_stopped_before_its_first_points_says_so(curve):
    computing(curve).stop()
    view = curve.view(N_KS)
    assert view.state is State.STOPPED and view.points is None and view.summary is None
    assert view.note == "Stopped before the first points."
    assert view.button == CONTINUE


def test_a_failed_curve_shows_the_error_and_offers_to_try_again(curve):
    error = AttributionError("the layer has no neurons")
    computing(curve, 1).fail(error)
    view = curve.view(N_KS)
    assert view.state is State.FAILED and view.state not in TO_COMPUTE
    assert view.error is error and view.button == TRY_AGAIN and view.points is None


def test_a_resumable_curve_shows_its_kept_points(curve):
    computing(curve, 4, 5).crash()
    view = curve.view(N_KS)
    assert view.state is State.RESUMABLE and view.state in TO_COMPUTE
    assert view.points is curve.kept and view.progress[0] == 0.25 and view.button == STOP


def test_the_progress_line_says_the_share_done_and_the_time_left():
    assert progress_words(0.4) == "40% of the k values computed"
    assert progress_words(0.4, "about 12 s left") == \
        "40% of the k values computed · about 12 s left (estimated from the points so far)"


# ------------------------------------------------------------------ transitions

@pytest.mark.parametrize("before", [State.NEW, State.RESUMABLE, State.COMPUTING])
def test_start_computes_and_returns_the_points_to_resume_from(curve, before):
    if before is State.RESUMABLE:
        computing(curve, 1).crash()
    elif before is State.COMPUTING:
        computing(curve, 1)
    assert curve.state is before
    kept = curve.kept
    assert curve.start() is kept
    assert curve.state is State.COMPUTING


def test_the_toolbar_stop_watch_starts_while_nothing_is_marked(curve):
    """Its first call runs inside the run that starts it: a mark left by a run that a rerun
    cut off must not read as a toolbar Stop there."""
    cut_off(curve, 1)
    assert curve.state is State.COMPUTING  # the mark the cut-off run left
    seen = []
    curve.start(watch=lambda: seen.append(curve.watch()))
    assert seen == [False] and curve.state is State.COMPUTING


def test_progress_keeps_the_points_as_they_arrive(curve):
    computing(curve, 1)
    curve.progress(points(1, 2))
    assert curve.state is State.COMPUTING and curve.kept["k"].nunique() == 2


def test_finish_completes_and_drops_the_kept_points(session, curve):
    computing(curve, 1).finish(points(1, 2))
    assert curve.state is State.COMPLETE
    assert KEY not in session["partial_curves"] and not session["running_curves"]
    assert curve.watch() is False  # nothing for the toolbar-stop watch


def test_fail_keeps_the_points_and_try_again_resumes_from_them(curve):
    computing(curve, 1, 2).fail(AttributionError("bad"))
    assert curve.state is State.FAILED and curve.watch() is False
    curve.retry()
    assert curve.state is State.RESUMABLE and curve.kept["k"].nunique() == 2


def test_try_again_without_points_starts_over(curve):
    computing(curve).fail(AttributionError("bad"))
    curve.retry()
    assert curve.state is State.NEW


def test_the_stop_button_stops_with_the_points_so_far_and_continue_resumes(curve):
    computing(curve, 1, 2).stop()
    assert curve.state is State.STOPPED and curve.watch() is False
    curve.resume()
    assert curve.state is State.RESUMABLE
    assert curve.start()["k"].nunique() == 2  # continuing computes only the rest


def test_continue_after_a_stop_before_the_first_points_starts_over(curve):
    computing(curve).stop()
    curve.resume()
    assert curve.state is State.NEW


def test_a_rerun_cuts_a_run_off_without_recording_anything(session, curve):
    cut_off(curve, 1, 2)
    assert curve.state is State.COMPUTING
    assert not session["stopped_curves"] and not session["failed_curves"]
    assert curve.kept["k"].nunique() == 2


def test_the_next_run_after_a_rerun_takes_the_curve_over_and_resumes(curve):
    cut_off(curve, 1, 2)
    resumed = []

    def compute(resume):
        resumed.append(resume["k"].nunique())
        return points(*range(N_KS))

    assert curve.run(compute) is State.COMPLETE
    assert resumed == [2]


def test_the_toolbar_stop_between_runs_becomes_a_stop_with_the_points_so_far(curve):
    cut_off(curve, 1, 2, 3)  # the toolbar's Stop ends a run like a rerun: nothing recorded
    assert curve.watch() is True  # the watch's next tick: the page redraws as stopped
    view = curve.view(N_KS)
    assert view.state is State.STOPPED and view.points["k"].nunique() == 3
    assert curve.watch() is False  # once


def test_a_crash_is_raised_and_never_shown_as_a_stop(session, curve):
    def compute(resume):
        curve.progress(points(1))
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        curve.run(compute)
    assert curve.state is State.RESUMABLE
    assert curve.watch() is False and not session["stopped_curves"]


def test_a_crash_before_the_first_points_leaves_a_new_curve(curve):
    def compute(resume):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        curve.run(compute)
    assert curve.state is State.NEW


# ------------------------------------------------------------------ run

def test_run_computes_a_new_curve_and_completes_it(curve):
    calls = []

    def compute(resume):
        calls.append(resume)
        for k in range(N_KS):
            curve.progress(points(*range(k + 1)))
            assert curve.state is State.COMPUTING  # live: the points arrive during the run
        return points(*range(N_KS))

    assert curve.run(compute) is State.COMPLETE
    assert calls == [None] and curve.kept is None


def test_run_records_a_user_mistake_as_a_failure(curve):
    restarts = []

    def compute(resume):
        raise AttributionError("This model has no layer with a neuron axis to score.")

    assert curve.run(compute, restarted=lambda: restarts.append(1)) is State.FAILED
    assert str(curve.view(N_KS).error).startswith("This model has no layer")
    assert not restarts  # nothing kept: nothing to restart from


def test_run_starts_over_when_the_kept_points_do_not_fit(curve):
    computing(curve, 1, 2).stop()
    curve.resume()
    calls, restarts = [], []

    def compute(resume):
        calls.append(None if resume is None else resume["k"].nunique())
        if resume is not None:
            raise AttributionError("the kept points are of other data")
        return points(*range(N_KS))

    assert curve.run(compute, restarted=lambda: restarts.append(1)) is State.COMPLETE
    assert calls == [2, None] and restarts == [1]


def test_run_fails_when_starting_over_fails_too(curve):
    computing(curve, 1).crash()

    def compute(resume):
        raise AttributionError("still wrong")

    assert curve.run(compute) is State.FAILED
    assert str(curve.view(N_KS).error) == "still wrong"


def test_run_starts_the_watch_between_dropping_and_setting_the_mark(curve):
    cut_off(curve, 1)
    order = []
    curve.run(lambda resume: order.append("compute") or points(1),
              watch=lambda: order.append(("watch", curve.state)))
    assert order == [("watch", State.RESUMABLE), "compute"]

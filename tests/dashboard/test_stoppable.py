"""A page's stoppable run (pages/shared/stoppable.py), driven directly: its states, what it
keeps, and the progress line that hands it each partial result before drawing."""
import pytest

from attribution.progress import SAY_ABOVE_SECONDS
from pages.shared import progress, stoppable
from pages.shared.stoppable import MAX_KEPT_RUNS, StoppableRun


@pytest.fixture
def session() -> dict:
    return {}


def test_a_run_keeps_its_last_partial_until_it_finishes(session):
    run = StoppableRun(session, ("scorecard", 1))
    assert (run.kept, run.stopped, run.finished) == (None, False, False)
    run.keep(["first"])
    run.keep(["first", "second"])
    assert run.kept == ["first", "second"]
    run.finish()
    assert (run.kept, run.stopped, run.finished) == (None, False, True)


def test_stop_keeps_what_was_done_and_continue_computes_from_it(session):
    run = StoppableRun(session, ("findings", 1))
    run.keep(["a check"])
    run.stop()
    assert run.stopped and run.kept == ["a check"]
    run.resume()
    assert not run.stopped and run.kept == ["a check"]  # the next run starts from it
    run.stop()
    run.finish()
    assert not run.stopped and run.kept is None


def test_runs_of_other_keys_are_their_own(session):
    one, other = StoppableRun(session, "one"), StoppableRun(session, "other")
    one.keep(1)
    one.stop()
    assert (other.kept, other.stopped) == (None, False)
    other.finish()
    assert one.stopped and not one.finished and other.finished


def test_the_stop_button_is_offered_for_a_long_run_not_yet_finished(session):
    """Offered where the estimate is over the time worth a progress line, or unknown; never
    for a run finished in this session (its cached result comes at once)."""
    run = StoppableRun(session, "scorecard")
    long, short = SAY_ABOVE_SECONDS * 2, SAY_ABOVE_SECONDS / 2
    assert run.offers_stop(long) and run.offers_stop(None) and not run.offers_stop(short)
    run.finish()
    assert not run.offers_stop(long) and not run.offers_stop(None)


def test_the_oldest_partial_results_are_dropped_first(session):
    runs = [StoppableRun(session, index) for index in range(MAX_KEPT_RUNS + 2)]
    for index, run in enumerate(runs):
        run.keep(index)
    runs[1].keep("again")  # kept again: the newest
    assert [run.kept for run in runs] == [None, "again", None] + list(
        range(3, MAX_KEPT_RUNS + 2))
    assert len(session[stoppable.KEPT]) == MAX_KEPT_RUNS


class Rerun(BaseException):
    """Streamlit's control flow when a click reruns the page mid-way."""


def test_the_progress_line_keeps_each_partial_before_it_draws(session, monkeypatch):
    """A rerun raised by the drawing (a click on Stop) comes after the partial is kept; work
    of unknown length and calls without a partial keep nothing new."""
    run = StoppableRun(session, "scorecard")

    def rerun(*_, **__):
        raise Rerun

    monkeypatch.setattr(progress.st, "progress", rerun)
    monkeypatch.setattr(progress.TimeLeft, "words",  # nothing to say before half-way
                        lambda self, fraction: "about 9 s left" if fraction >= 0.5 else "")
    line = progress.ProgressLine("Measuring", keep=run.keep)
    line(float("nan"), "unknown length")
    assert run.kept == "unknown length"
    line(0.1)
    assert run.kept == "unknown length"
    with pytest.raises(Rerun):
        line(0.5, "half")
    assert run.kept == "half"
    with pytest.raises(Rerun):
        progress.ProgressLine("Without a run")(0.6, "nothing kept")
    assert run.kept == "half"

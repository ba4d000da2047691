"""The life of one pruning curve in a session: the Pruning page's state machine, without
streamlit, so that every state and transition is tested directly
(tests/dashboard/test_curve_states.py). The page only draws what `PruningCurve.view` says and
calls the transitions from its buttons, its progress callback and its toolbar-stop watch.

A curve is known by its key (`keys.curve_key`: the workspace and every setting the curve is
computed from). Its state lives in five session-state stores, shared by every curve key:

    curves          key -> the finished curves
    stopped_curves  key -> the points computed before a stop (None: stopped before the first)
    partial_curves  key -> the points computed so far, kept as they arrive
    failed_curves   key -> the AttributionError that ended the computation
    running_curves  the keys a run is computing (or was, until a rerun or the toolbar's Stop
                    ended that run without a word)

States, read from the stores in this order:

    COMPLETE   finished: the curves and their summary in words
    STOPPED    stopped by the page's Stop button or the toolbar's: the points so far and their
               summary, or a line saying it stopped before the first points; Continue
    FAILED     the error; Try again
    COMPUTING  marked as running: a run computes it now, points drawn as they arrive (live)
    RESUMABLE  points kept and nothing else (after Continue, Try again or a crash): the next
               run of the page resumes from them
    NEW        nothing kept: the next run of the page computes from the first k

Transitions:

    NEW, RESUMABLE, COMPUTING --start--> COMPUTING
        a run of the page computes it; a curve still COMPUTING here lost its run to a rerun (a
        choice changed, another page, a closed tab): this run takes it over and resumes
    COMPUTING --progress--> COMPUTING      points arrive; kept before anything else
    COMPUTING --finish--> COMPLETE         the kept points are dropped
    COMPUTING --fail--> FAILED             an AttributionError; the kept points stay
    COMPUTING --crash--> RESUMABLE or NEW  any other exception: shown as a crash, never a stop
    COMPUTING --stop--> STOPPED            the page's Stop button; `watch` between runs
                                           (the toolbar's Stop left it marked)
    COMPUTING --(rerun)--> COMPUTING       a rerun ends the run mid-way and records nothing
    STOPPED --resume--> RESUMABLE or NEW   Continue the curve
    FAILED --retry--> RESUMABLE or NEW     Try again

`run` is start, then the computation (resumed from the kept points, from the first k when
they do not fit), then finish, fail or crash.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Hashable, MutableMapping, Optional

from attribution.errors import AttributionError

MAX_KEPT_CURVES = 16  # finished (and, separately, unfinished) curves kept per session
STOP = "Stop the curve"
CONTINUE = "Continue the curve"
TRY_AGAIN = "Try again"


class State(enum.Enum):
    NEW = "new"
    RESUMABLE = "resumable"
    COMPUTING = "computing"
    STOPPED = "stopped"
    FAILED = "failed"
    COMPLETE = "complete"


TO_COMPUTE = frozenset({State.NEW, State.RESUMABLE, State.COMPUTING})
"""States a run of the page computes (`PruningCurve.run`)."""


@dataclass(frozen=True)
class View:
    """What the page shows for a curve in `state`."""

    state: State
    points: Any = None  # the curves drawn: finished, stopped, or kept to resume from
    note: str = ""  # the caption under the chart; with no chart, the line shown instead
    summary: Optional[str] = None  # the heading of the summary in words; None: no summary
    button: Optional[str] = None  # the label of the one button
    error: Optional[BaseException] = None  # FAILED: what to say
    progress: Optional[tuple[float, str]] = None  # to compute: where the progress line starts


def progress_words(fraction: float, time_left: str = "") -> str:
    """The progress line of a computing run, e.g. "40% of the k values computed · about 12 s
    left (estimated from the points so far)"."""
    estimate = f" · {time_left} (estimated from the points so far)" if time_left else ""
    return f"{fraction:.0%} of the k values computed{estimate}"


def keep(store: dict, key: Hashable, value: Any) -> None:
    """Store `value` under `key`, dropping the oldest beyond MAX_KEPT_CURVES."""
    store.pop(key, None)
    while len(store) >= MAX_KEPT_CURVES:
        store.pop(next(iter(store)))
    store[key] = value


class PruningCurve:
    """The curve with key `key`, its state kept in `session` (st.session_state or a dict)."""

    def __init__(self, session: MutableMapping, key: Hashable):
        self.key = key
        self.finished: dict = session.setdefault("curves", {})
        self.stopped: dict = session.setdefault("stopped_curves", {})
        self.partials: dict = session.setdefault("partial_curves", {})
        self.failed: dict = session.setdefault("failed_curves", {})
        self.running: set = session.setdefault("running_curves", set())

    @property
    def state(self) -> State:
        if self.key in self.finished:
            return State.COMPLETE
        if self.key in self.stopped:
            return State.STOPPED
        if self.key in self.failed:
            return State.FAILED
        if self.key in self.running:
            return State.COMPUTING
        return State.RESUMABLE if self.key in self.partials else State.NEW

    @property
    def kept(self) -> Any:
        """The points computed so far by the runs that computed it (None: none)."""
        return self.partials.get(self.key)

    def view(self, n_ks: int) -> View:
        """What the page shows now; `n_ks`: how many k values the whole curve has."""
        state = self.state
        if state is State.COMPLETE:
            return View(state, self.finished[self.key], "Complete. Change the cluster, method "
                        "or settings to compute again.", summary="In words")
        if state is State.STOPPED:
            points = self.stopped[self.key]
            if points is None:
                return View(state, note="Stopped before the first points.", button=CONTINUE)
            return View(state, points, f"Stopped: the curve shows the {points['k'].nunique()} "
                        f"of {n_ks} k values computed before the stop; continuing computes "
                        "only the rest.", summary="In words, from the points computed so far",
                        button=CONTINUE)
        if state is State.FAILED:
            return View(state, error=self.failed[self.key], button=TRY_AGAIN)
        kept = self.kept
        if kept is None:
            return View(state, button=STOP, progress=(0.0, "Computing the first points…"))
        fraction = kept["k"].nunique() / n_ks
        return View(state, kept, button=STOP, progress=(
            fraction, f"Resuming from the {fraction:.0%} of the k values computed before…"))

    # ------------------------------------------------------------------ transitions

    def start(self, watch: Optional[Callable[[], None]] = None) -> Any:
        """NEW, RESUMABLE or COMPUTING -> COMPUTING; returns the points to resume from.

        A mark left by a run that a rerun cut off is dropped first, and `watch` (the page's
        toolbar-stop watch, a fragment whose first call runs inside this run) starts while
        nothing is marked: that first call must find nothing to stop."""
        self.running.discard(self.key)
        if watch is not None:
            watch()
        self.running.add(self.key)
        return self.kept

    def progress(self, points: Any) -> None:
        """COMPUTING: the points computed so far arrived. Kept before anything else is done
        with them: a rerun or a stop may end the run at any call."""
        keep(self.partials, self.key, points)

    def finish(self, curves: Any) -> None:
        """COMPUTING -> COMPLETE."""
        self.partials.pop(self.key, None)
        keep(self.finished, self.key, curves)
        self.running.discard(self.key)

    def fail(self, error: BaseException) -> None:
        """COMPUTING -> FAILED (the kept points stay, for Try again)."""
        keep(self.failed, self.key, error)
        self.running.discard(self.key)

    def crash(self) -> None:
        """COMPUTING -> RESUMABLE or NEW: an unexpected exception ended the run; it shows as
        the crash it is, never as a stop (`watch` finds nothing marked)."""
        self.running.discard(self.key)

    def stop(self) -> None:
        """COMPUTING -> STOPPED, with the points computed so far."""
        self.stopped[self.key] = self.partials.get(self.key)
        self.running.discard(self.key)

    def watch(self) -> bool:
        """Between runs: a curve still marked as running lost its run to the toolbar's Stop,
        which leaves that run's progress bar and stop button frozen on the page. Record the
        stop (COMPUTING -> STOPPED) and say so: the page then redraws."""
        if self.key not in self.running:
            return False
        self.stop()
        return True

    def resume(self) -> None:
        """STOPPED -> RESUMABLE (or NEW): Continue the curve from the points kept."""
        self.stopped.pop(self.key, None)

    def retry(self) -> None:
        """FAILED -> RESUMABLE (or NEW): Try again."""
        self.failed.pop(self.key, None)

    def run(self, compute: Callable[[Any], Any], watch: Optional[Callable[[], None]] = None,
            restarted: Callable[[], None] = lambda: None) -> State:
        """Start, compute and record the outcome; returns the state it ends in.

        `compute(resume)` computes the curves from the points `resume` (None: from the first
        k), calling `progress` as points arrive. Kept points that do not fit (an
        AttributionError, e.g. other data) are dropped for a computation from the first k,
        after `restarted()`. An AttributionError -> FAILED; any other exception -> crash,
        raised again. A rerun (Streamlit's control flow, no Exception) passes through and
        leaves the curve COMPUTING."""
        resume = self.start(watch)
        try:
            try:
                curves = compute(resume)
            except AttributionError:
                if resume is None:
                    raise
                restarted()
                curves = compute(None)
        except AttributionError as error:
            self.fail(error)
        except Exception:
            self.crash()
            raise
        else:
            self.finish(curves)
        return self.state

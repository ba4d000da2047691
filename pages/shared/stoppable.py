"""A long computation of a page that the page's own Stop button ends without losing what it
had done: the scorecard on the Trust page, the checks on the Diagnosis page. Without
streamlit, like `curve_states`, so that every state is tested directly
(tests/dashboard/test_stoppable.py); the page draws what `StoppableRun` says and hands its
transitions to its buttons and its progress line.

A run is known by its key (everything it is computed from). Its state lives in three
session-state stores, shared by every key:

    kept_runs      key -> the partial result its progress last reported
    stopped_runs   the keys stopped by the page's Stop button (and not continued since)
    finished_runs  the keys computed to the end in this session

States, read in this order:

    STOPPED    the page shows what was kept (or that nothing was) and a Continue button
    FINISHED   computed before in this session: the cached result, no Stop button
    TO RUN     the page shows the Stop button and calls the computation with what was kept
               (a run a rerun cut off, or one continued after a stop, resumes from it where
               the computation can resume), keeping each partial result as it arrives

A click on Stop reruns the page: the run in progress ends at its next progress call, and
the click's callback marks the key stopped before the page runs again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, MutableMapping, Optional

import attribution.progress

MAX_KEPT_RUNS = 8  # partial results kept per session, the oldest dropped first
KEPT, STOPPED, FINISHED = "kept_runs", "stopped_runs", "finished_runs"


@dataclass(frozen=True)
class StoppableRun:
    """The state of the run known by `key` in `state` (a page's session state)."""

    state: MutableMapping
    key: Hashable

    def _store(self, name: str) -> dict:
        return self.state.setdefault(name, {})

    @property
    def stopped(self) -> bool:
        """Was it stopped by the page's button (and not continued since)?"""
        return self.key in self._store(STOPPED)

    @property
    def finished(self) -> bool:
        """Was it computed to the end in this session (its result is cached)?"""
        return self.key in self._store(FINISHED)

    @property
    def kept(self) -> Optional[Any]:
        """The partial result its progress last reported, or None."""
        return self._store(KEPT).get(self.key)

    def offers_stop(self, estimate: Optional[float]) -> bool:
        """Does the page draw the Stop button before the run: not where it finished in this
        session (its cached result comes at once, no button flashes), nor where its
        estimate (seconds; None: not known) is under the time worth a progress line?"""
        return not self.finished and (estimate is None
                                      or attribution.progress.worth_saying(estimate))

    def keep(self, partial: Any) -> None:
        """A progress call's partial result (kept before the page draws anything: a stop
        or rerun may end the run at the next drawing)."""
        kept = self._store(KEPT)
        kept.pop(self.key, None)
        kept[self.key] = partial
        while len(kept) > MAX_KEPT_RUNS:
            kept.pop(next(iter(kept)))

    def stop(self) -> None:
        """The Stop button's callback: what was kept stays, shown as it is."""
        self._store(STOPPED)[self.key] = True

    def resume(self) -> None:
        """The Continue button's callback: the next run computes from what was kept."""
        self._store(STOPPED).pop(self.key, None)

    def finish(self) -> None:
        """Computed to the end: the partial result is dropped."""
        self._store(KEPT).pop(self.key, None)
        self._store(STOPPED).pop(self.key, None)
        finished = self._store(FINISHED)
        finished[self.key] = True
        while len(finished) > 4 * MAX_KEPT_RUNS:
            finished.pop(next(iter(finished)))

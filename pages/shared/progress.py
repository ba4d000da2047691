"""Progress of a long computation on the page: one line that says how much is done and about
how long is left, drawn only when the work takes a while."""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

import streamlit as st

from attribution.progress import TimeLeft


class ProgressLine:
    """A library `progress=` callback that draws "what: 40% done · about 12 s left", only once
    the estimate (`TimeLeft`, from the first batch) exceeds SAY_ABOVE_SECONDS: fast work shows
    nothing. It creates its line where it is first called and removes it at fraction 1.0 or on
    leaving `with line:`. Inside an `st.cache_data` function enter it there (one line per
    call): the cache then records the line's removal too, and a hit replays a line that is gone
    (a line drawn before the call could not be replayed at all)."""

    REDRAW_SECONDS = 0.2  # at most this often: each draw is also kept for the cache's replay

    def __init__(self, what: str, keep: Optional[Callable[[Any], None]] = None):
        """`keep`: called first with each call's partial result (a `StoppableRun`'s), where
        the work reports one."""
        self.what, self.keep, self.time_left, self.bar, self.drawn_at = \
            what, keep, TimeLeft(), None, 0.0

    def __call__(self, fraction: float, *partial) -> None:
        if self.keep is not None and partial:
            self.keep(partial[0])
        if not math.isfinite(fraction):  # work of unknown length: nothing to estimate
            return
        if fraction >= 1.0:
            self.close()
            return
        estimate, now = self.time_left.words(fraction), time.monotonic()
        if (self.bar is None and not estimate) or now - self.drawn_at < self.REDRAW_SECONDS:
            return
        text = f"{self.what}: {fraction:.0%} done" + (f" · {estimate}" if estimate else "")
        if self.bar is None:
            self.bar = st.progress(fraction, text=text)
        else:
            self.bar.progress(fraction, text=text)
        self.drawn_at = now

    def close(self) -> None:
        """Remove the line (the work ended, or failed)."""
        if self.bar is not None:
            self.bar.empty()
            self.bar = None

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *_) -> None:
        self.close()  # a failed computation leaves no line behind

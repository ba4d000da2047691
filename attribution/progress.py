"""How long long work still takes, estimated from how fast its first steps went.

Every long computation here reports progress(fraction, ...) as it advances; `TimeLeft` turns
those fractions into "about 12 s left" from the first batch on, for any caller (the app's
pages, a notebook) to show."""
import math
import time
from typing import Callable, Optional

SAY_ABOVE_SECONDS = 3.0  # work that ends sooner than this is not worth an estimate


def worth_saying(seconds: float) -> bool:
    """Is work of `seconds` long enough for a progress line, a Stop button and its price?
    (SAY_ABOVE_SECONDS read at the call: a test may lower it.)"""
    return seconds > SAY_ABOVE_SECONDS


class TimeLeft:
    """Seconds a piece of work still needs, from the fraction it gained since `restart`.

    The rate is (fraction done - fraction at the start) / seconds spent, so one progress call
    (the first batch) is enough for an estimate. `clock` is injectable for tests.
    """

    def __init__(self, start_fraction: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.restart(start_fraction)

    def restart(self, start_fraction: float = 0.0) -> None:
        """Measure from now, with `start_fraction` of the work already done (e.g. resumed)."""
        self.started, self.start_fraction = self.clock(), start_fraction

    def seconds(self, fraction: float) -> Optional[float]:
        """Seconds left at `fraction` (0..1) done; None until some progress was measured, or
        when the fraction is unknown (NaN: work of unknown length)."""
        if not math.isfinite(fraction):
            return None
        gained, spent = fraction - self.start_fraction, self.clock() - self.started
        if gained <= 0 or spent <= 0:
            return None
        return max(1.0 - fraction, 0.0) * spent / gained

    def words(self, fraction: float, above: float = SAY_ABOVE_SECONDS) -> str:
        """'about 12 s left' ('about 3 min left' from 90 s on) when more than `above` seconds
        are left at `fraction` done, else '' (nothing worth saying yet, or almost done)."""
        left = self.seconds(fraction)
        if left is None or left <= above:
            return ""
        return f"about {left:.0f} s left" if left < 90 else f"about {left / 60:.0f} min left"

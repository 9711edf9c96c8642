"""What a handler raises to steer its own job, and what BackWave raises into a handler that was
told to stop: ``backwave.Snooze``, ``backwave.Discard``, ``backwave.Cancelled`` and
``backwave.TimeLimitExceeded``. Their public names are the ones stored as an attempt's error class.
"""

from __future__ import annotations

import math
from datetime import timedelta

from ..core.backoff import MAX_DELAY

# A snooze is a delay like a retry's, under the same ceiling.
MAX_SNOOZE = MAX_DELAY


def seconds_of(value, *, what: str) -> float:
    """``value`` (a number of seconds or a timedelta) as finite seconds >= 0, or ValueError naming ``what``."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a number of seconds >= 0 or a timedelta, got {value!r}")
    return float(value)


class Snooze(Exception):
    """Raise in a handler to run the job again ``seconds`` from now (a number or a timedelta).

    Not a failure: the attempt is logged as snoozed and left out of max_attempts and of the
    retry backoff (it is counted in the job's forgiven_attempts). The attempt number still goes
    up, so the attempt log keeps every try.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = seconds_of(seconds, what="backwave.Snooze(seconds)")
        if self.seconds > MAX_SNOOZE:
            raise ValueError(f"backwave.Snooze(seconds) must be at most {MAX_SNOOZE:,.0f} (a year), got {self.seconds!r}")
        super().__init__(f"snoozed for {self.seconds:g} s")


class Discard(Exception):
    """Raise in a handler to fail the job now, without the retries it has left."""

    def __init__(self, reason: str = "") -> None:
        self.reason = str(reason)
        super().__init__(self.reason or "discarded by its handler")


class Cancelled(Exception):
    """Raised by ``context.raise_if_stopping()`` once the job was cancelled while it ran; the
    attempt ends cancelled however the handler ends."""


class TimeLimitExceeded(Exception):
    """The attempt ran past its time limit. Raised by ``context.raise_if_stopping()``, and the
    error class of an attempt the worker ended at its limit."""


for _kind in (Snooze, Discard, Cancelled, TimeLimitExceeded):
    _kind.__module__ = "backwave"
del _kind

"""argparse types for the commands' options, bounded so that a mistaken value is refused where
it is typed, before a query runs: a count past what PostgreSQL's bigint holds, an age that puts
the cut before year 1, a name the column cannot hold. Each raises ``ArgumentTypeError`` with what
the option takes; Django's parser turns it into a CommandError (or a usage error at a terminal).

``call_command()`` hands keyword options to ``handle()`` without these types; the commands pass
such values through ``coerce()`` so the same bounds hold there."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

from backwave.store.storable import text_problem
from backwave.tasking.cancelling import MAX_BY_LENGTH, MAX_JOB_ID

AGE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>s|m|min|h|d|w)\Z")
AGE_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_AGE = timedelta(days=36525)  # a century: older than anything retention keeps, far from year 1
MAX_LIMIT = 100_000  # rows one listing loads into memory; --offset pages past it
MAX_OFFSET = 2**63 - 1  # PostgreSQL's OFFSET is a bigint


class Bounded:
    """A whole number from ``low`` to ``high``; ``what`` says what it counts."""

    def __init__(self, low: int, high: int, what: str = "a whole number"):
        self.low, self.high, self.what = low, high, what

    def __call__(self, text) -> int:
        value = text if isinstance(text, int) and not isinstance(text, bool) else _whole(text)
        if value is None or not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"{self.what} from {self.low:,} to {self.high:,}, got {text!r:.40}")
        return value


def _whole(text) -> int | None:
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not (text.isascii() and text.lstrip("+-").isdigit()) or len(text) > 25:
        return None
    return int(text)


job_id = Bounded(1, MAX_JOB_ID, "a job id is a whole number")
limit = Bounded(1, MAX_LIMIT, "a whole number")
offset = Bounded(0, MAX_OFFSET, "a whole number")


def age(text: str | timedelta) -> timedelta:
    """'90s', '15m', '2h', '7d', '1w' -> a timedelta of at most ``MAX_AGE``."""
    if isinstance(text, timedelta) and timedelta(0) <= text <= MAX_AGE:
        return text
    match = AGE.match(str(text).strip().lower()) if isinstance(text, str) else None
    if not match:
        raise argparse.ArgumentTypeError(f"give a number and a unit (s, m, h, d, w), e.g. 30m or 7d; got {text!r:.40}")
    seconds = float(match["number"]) * AGE_UNITS[match["unit"]]
    if not seconds <= MAX_AGE.total_seconds():
        raise argparse.ArgumentTypeError(f"at most 100 years ({MAX_AGE.days:,}d), got {text!r:.40}")
    return timedelta(seconds=seconds)


def cancelled_by(text: str) -> str:
    """Who cancels, as ``backwave.cancel(by=...)`` takes it: what ``Job.cancel_requested_by`` holds."""
    if not isinstance(text, str) or not 1 <= len(text) <= MAX_BY_LENGTH or text_problem(text):
        raise argparse.ArgumentTypeError(
            f"who cancels must be 1 to {MAX_BY_LENGTH} characters without a NUL or a lone surrogate, got {text!r:.80}"
        )
    return text


def coerce(option: str, kind, value):
    """``value`` through the type ``kind`` of ``option``, for options given to ``call_command()``
    as keywords (which skip the parser); a CommandError naming the option otherwise."""
    from django.core.management.base import CommandError

    try:
        return kind(value)
    except argparse.ArgumentTypeError as error:
        raise CommandError(f"{option}: {error}") from None

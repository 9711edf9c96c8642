"""The virtual clock of the deterministic test pump."""

from __future__ import annotations

import math
from datetime import timedelta


class VirtualClock:
    """BackWave's time inside a test: seconds that pass only when ``advance()`` says so.

    It drives two clocks at once. The Node Driver reads ``monotonic()`` (seconds since the clock
    was made). The database clock becomes ``now() + offset``: every statement of the test pump's
    store adds ``offset`` to PostgreSQL's ``now()``, so leases, retries and due times move with
    the virtual clock while the rows your code enqueues (stamped with the plain ``now()``) are
    due at once, as they would be in production.
    """

    def __init__(self) -> None:
        self._elapsed = 0.0

    def monotonic(self) -> float:
        """The driver's clock: virtual seconds since the start."""
        return self._elapsed

    @property
    def offset(self) -> timedelta:
        """How far the database clock is moved ahead of PostgreSQL's ``now()``."""
        return timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (a finite number >= 0)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"advance() takes a finite number of seconds >= 0, got {seconds!r}; time never runs backwards")
        self._elapsed += float(seconds)

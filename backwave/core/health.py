"""A pump's health, spelled once for every layer that reports or reads it: the pump sets it,
the health endpoint and ``backwave_health`` add pumps up by it, the Pump table stores it.

healthy; degraded (a transient store fault: it retries on its own); halted (fail-stop: it
stopped, its lease lapses and other pumps take its jobs).

A queue is degraded when it has a due job and no live pump serves it (``UnservedQueue``): its jobs
wait for ever, however healthy every pump is. The dashboard, the Queues page, ``backwave_health``
and a worker's health endpoint say so in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

HEALTHY, DEGRADED, HALTED = "healthy", "degraded", "halted"


def wait_span(seconds: float) -> str:
    """22 -> '22 s', 750 -> '12 min', 10800 -> '3 h', 259200 -> '3 d': how long a job has waited."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} d"


@dataclass(frozen=True, slots=True)
class UnservedQueue:
    """A queue with a due ready job that no live pump serves (not halted, under a live lease,
    listing the queue): ``due_for`` is how long its oldest due job has waited, in seconds."""

    name: str
    due_for: float
    database: str = "default"

    status = DEGRADED

    @property
    def due_shown(self) -> str:
        return wait_span(self.due_for)

    @property
    def reason(self) -> str:
        return f"due for {self.due_shown}; no worker serves `{self.name}`"

"""Exponential backoff with full jitter, the randomness passed in so the core stays deterministic."""

from __future__ import annotations

from dataclasses import dataclass

# The longest any job waits to run again: a retry's backoff (the default one or a task's own),
# a snooze, an attempt ended at its time limit. Longer is a unit mistake (milliseconds given as
# seconds), and far longer is past the dates PostgreSQL's timestamptz holds, where the write
# would fail the job for good instead of retrying it. Options that set a delay are refused
# above it; a delay computed at run time (a task's backoff(), doubling) is cut to it.
MAX_DELAY = 366 * 86_400.0  # a year (a leap one)


def retry_delay(*, attempt: int, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based).

    The ceiling doubles per attempt from ``base`` up to ``cap``; the delay is drawn uniformly from
    its upper half (``jitter`` in [0, 1)), so retries spread out yet never come sooner than half the
    nominal wait. Half-jitter rather than full jitter keeps a retry from landing at once. The
    ceiling never passes MAX_DELAY, whatever ``cap`` a job was enqueued with.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, got {attempt}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    if base < 0 or cap < 0:
        raise ValueError(f"backoff base and cap must not be negative (base={base}, cap={cap})")
    ceiling = min(cap, MAX_DELAY, base * (2.0 ** min(attempt - 1, 62)))
    return ceiling / 2.0 + (ceiling / 2.0) * jitter


def bounded_delay(seconds: float) -> float:
    """A delay computed at run time, cut to MAX_DELAY: a retry stays a retry however far off."""
    return min(float(seconds), MAX_DELAY)


def fault_delay(*, streak: int, base: float, cap: float, jitter: float) -> float:
    """Seconds before the store is tried again after ``streak`` transient faults in a row.

    The nominal delay doubles from ``base`` per fault up to ``cap``; ``jitter`` in [0, 1) spreads
    the actual delay over [0.5, 1.5) times the nominal one, so the pumps of a cluster that all
    lost the same database do not reconnect in step. A jitter of 0.5 gives the nominal delay.
    """
    if streak < 1:
        raise ValueError(f"streak must be 1 or more, got {streak}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    if base < 0 or cap < 0:
        raise ValueError(f"fault backoff base and cap must not be negative (base={base}, cap={cap})")
    nominal = min(cap, base * (2.0 ** min(streak - 1, 62)))
    return nominal * (0.5 + jitter)


@dataclass
class FaultStreak:
    """Transient store faults in a row; any store result ends the streak."""

    faults: int = 0
    last_at: float = 0.0

    def retry_at(self, *, now: float, jitter: float, base: float, cap: float) -> float:
        """Count a fault at ``now``; when to try the store again."""
        if not (self.faults and now == self.last_at):
            # Failures reported at one instant are one failed round-trip (a pipelined claim
            # fails with the write it rode on): they back off as one fault.
            self.faults += 1
        self.last_at = now
        return now + fault_delay(streak=self.faults, base=base, cap=cap, jitter=jitter)

    def end(self) -> None:
        self.faults = 0

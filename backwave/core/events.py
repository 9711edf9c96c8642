"""Events: facts the shell feeds into the Node Driver. Each carries ``now``, the shell's
monotonic clock in seconds, because the driver reads no clock of its own."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from .jobs import ClaimedJob


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Started(Event):
    """The pump is up and wants to work."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseOpened(Event):
    """The store created the lease the pump asked for."""

    lease_id: uuid.UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick(Event):
    """The pump's single timer fired (at or after ``driver.next_wakeup()``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HintReceived(Event):
    """A Wake-Up Hint arrived: bring the next poll forward. Never required for correctness."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimReturned(Event):
    """The claim the driver asked for returned these jobs (possibly none)."""

    jobs: tuple[ClaimedJob, ...]


# "discarded": failed, and no retry whatever attempts are left (backwave.Discard, discard_on, a
# backoff that said no more). "snoozed": the handler asked to run again after ``delay`` seconds.
# "cancelled": it stopped because its context said it was cancelled.
# "committed": an atomic task's success, written by the attempt itself in the transaction of its
# effects, fenced like a batch write (backwave/shell/execution.py): the driver writes nothing.
JobResult = Literal["succeeded", "failed", "unroutable", "discarded", "snoozed", "cancelled", "committed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFinished(Event):
    """An attempt ended. ``jitter`` in [0, 1) is the shell's random draw for a retry's backoff.

    ``report`` is the shell's own account of the attempt (return value, error text, what to tell
    Django's signals), opaque to the driver: it rides on the Outcome into WriteOutcomes, so it
    lives exactly as long as the outcome does, and the shell keeps no map of its own.
    """

    job_id: int
    attempt: int
    result: JobResult
    jitter: float = 0.0
    # Seconds before the job runs again: a snooze's (required), or a failure's as the task's
    # backoff callable computed it (None: the default exponential backoff).
    delay: float | None = None
    report: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(Event):
    """Someone (``by``: an admin user, the API, a command) asked to cancel a job, which may be
    running on this pump: a NOTIFY heard by the hint listener, or the heartbeat's answer."""

    job_id: int
    by: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomesWritten(Event):
    """The outcome write landed; ``applied`` are the ids the fence let through, ``released`` the
    dependents it made ready (jobs whose last ancestor's success it applied), ``busy`` the ids
    whose row another transaction held: not written, to be written again later."""

    applied: frozenset[int]
    released: int = 0
    busy: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRenewed(Event):
    """The heartbeat landed. ``held`` is False when the lease was gone (expired by someone else).
    ``cancels``: (job id, who asked) of each cancel requested of a job running under the lease."""

    held: bool
    cancels: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeasesExpired(Event):
    """A maintenance run released ``released`` jobs from lapsed leases (anyone's)."""

    released: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulesMinted(Event):
    """A maintenance run minted ``minted`` jobs from due schedule slots."""

    minted: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsPurged(Event):
    """A purge batch deleted ``purged`` finished jobs (with their attempts)."""

    purged: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsRolledUp(Event):
    """A rollup page folded ``rolled`` finished attempts into the per-task statistics."""

    rolled: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TablesAnalyzed(Event):
    """A maintenance run analyzed these tables (none: every table's statistics were fresh)."""

    tables: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PumpsPurged(Event):
    """A maintenance run forgot ``purged`` silent pumps."""

    purged: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStatsPurged(Event):
    """A maintenance run deleted ``purged`` per-task statistics buckets past retention."""

    purged: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsReleased(Event):
    """Jobs the driver gave back are ready again; ``busy`` ones were passed over (another
    transaction held their rows) and still run under the lease."""

    released: frozenset[int]
    busy: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseReconciled(Event):
    """Attempts that ran under the lease unknown to the driver were given back: (job id, attempt).
    ``busy``: the ids of such jobs passed over (another transaction held their rows)."""

    released: frozenset[tuple[int, int]]
    busy: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class OverrunsForgotten(Event):
    """ForgetOverruns landed: this many overruns were deleted (none: they went with a lease)."""

    forgotten: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseReleased(Event):
    """The lease is gone and whatever ran under it is ready again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreFailed(Event):
    """A command failed with a transient store fault (connection lost, restart, timeout).

    ``command`` is the command that failed. Commands after it in the same list that the shell
    did not run are reported as failed too, in order. ``jitter`` in [0, 1) is the shell's random
    draw that spreads the retry (0.5: exactly the nominal backoff).
    """

    command: object
    jitter: float = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainRequested(Event):
    """Stop claiming; let running jobs finish within ``timeout`` seconds, then give back the rest."""

    timeout: float

"""Worker group options and their validation (the seeds' two messages, word for word), and the
store's per-statement time limits, which follow from the groups' leases."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from .policy import DispatchPolicy, Strict


class WorkerGroupConfigError(ValueError):
    """A worker group is configured in a way BackWave cannot run."""


DAY = 86_400.0
DEFAULT_LEASE_DURATION = 30.0

# A pump stops trusting its lease this far before the lease's nominal end (as seen from the last
# renewal it sent), so it fences itself before another node could have expired the lease.
SELF_FENCE_MARGIN = 0.1

# No interval of a group may exceed a week: a longer poll, lease or drain is a unit mistake
# (milliseconds for seconds), and PostgreSQL's interval arithmetic stays far from its range.
MAX_INTERVAL = 7 * DAY

# Why a fifth of the lease: the pump is single-threaded on its store, so a renewal due while a
# statement runs waits for it. With the default heartbeat (a third of the lease) a renewal held
# up by a statement cut at a fifth, then by a fault backoff (at most half a heartbeat), is sent
# by 1/3 + 1/5 + 1/6 = 70% of the lease, before the self-fence at 90%. A third of that for
# locks: a row lock BackWave's own statements hold lasts one short statement, so a longer wait
# means someone else holds it (a long transaction, a migration) and is reported as such
# (SQLSTATE 55P03, not 57014) while the pump still has most of its statement budget.
STATEMENT_TIMEOUT_SHARE_OF_LEASE = 1 / 5

# Why 10 ms: a slot of a job that finished waits at most this for the next write, instead of for
# the slowest job of its batch. Shorter splits batches of fast jobs: 16 no-op jobs take 2-3 ms of
# GIL time to run, so at 2 ms a pool-16 pump wrote 0.10 round-trips per job instead of 0.064 and
# drained a third slower (PostgreSQL's CPU per round-trip is the bottleneck on a small server).
# It applies only while the pool is expected to go idle within a round-trip (the driver learns
# task durations, core/transitions.py ****): beside longer jobs an outcome is written at once.
# bench/sleepers.py --linger-ms shows the trade-off: round-trips per job against efficiency.
DEFAULT_OUTCOME_LINGER = 0.010
MAX_OUTCOME_LINGER = 60.0

# A job claimed ahead waits for a thread of the pool instead of for the next round-trip, but it
# also waits there while another worker may be idle, and it is counted as running from its claim.
# So a pump claims ahead only while every task it has seen finish took less than this on
# average (its learned duration) and the pool runs no job of a task it has not seen finish: a
# job claimed ahead then starts within about this long. A pool of longer jobs (or of jobs not
# measured yet, as at start-up) claims for its free threads only, as a pump without claim-ahead.
CLAIM_AHEAD_HORIZON = 1.0
MAX_CLAIM_AHEAD = 10_000
LOCK_TIMEOUT_SHARE_OF_STATEMENT = 1 / 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """How long maintenance keeps finished jobs (per final state), the health rows of pumps
    that stopped reporting, and the per-task statistics' minute and hour buckets, in seconds
    since they finished, last reported or began; None keeps them.

    Cluster-wide: every maintenance run purges by the same rules (``BACKWAVE["RETENTION"]``).
    A job's attempts go with it.
    """

    succeeded: float | None = DAY
    failed: float | None = 7 * DAY
    cancelled: float | None = 7 * DAY
    quarantined: float | None = 7 * DAY
    pumps: float | None = 3_600.0  # a pump silent this long (killed, host gone) is forgotten
    # Per-task statistics buckets, by the width they span: past the admin's longest range at that
    # width (an hour of minutes, seven days of hours), with room to spare.
    task_stats_minutely: float | None = 2 * DAY  # the Task statistics page's "last hour" reads these
    task_stats_hourly: float | None = 30 * DAY  # its "last 24 hours" and "last 7 days" read these

    def __post_init__(self):
        for name in ("succeeded", "failed", "cancelled", "quarantined", "pumps", "task_stats_minutely", "task_stats_hourly"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise WorkerGroupConfigError(
                    f"Retention {name} must be a number of seconds >= 0 or None (keep for ever), got {value!r}."
                )

    @property
    def job_states(self) -> tuple[tuple[str, float], ...]:
        """(state, seconds) for every finished state that is purged at all, in a fixed order."""
        pairs = (
            ("succeeded", self.succeeded),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
            ("quarantined", self.quarantined),
        )
        return tuple((state, float(seconds)) for state, seconds in pairs if seconds is not None)

    @property
    def task_stats(self) -> tuple[tuple[int, float], ...]:
        """(bucket width in seconds, seconds kept) for every statistics resolution purged at all
        (the widths of backwave/taskstats.py's RESOLUTIONS)."""
        pairs = ((60, self.task_stats_minutely), (3600, self.task_stats_hourly))
        return tuple((width, float(seconds)) for width, seconds in pairs if seconds is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerGroupOptions:
    """One worker group: its queues (through the policy) and every throughput dial.

    A group's peak concurrency on a node is ``pumps * pool_size``. Intervals are seconds.
    """

    name: str
    policy: DispatchPolicy = field(default_factory=lambda: Strict("default"))
    pool_size: int = 20
    pumps: int = 1
    max_claim_batch: int = 32
    max_outcome_batch: int | None = None  # None: falls back to max_claim_batch
    # Jobs a pump may hold claimed beyond its pool, each waiting for a thread (see
    # CLAIM_AHEAD_HORIZON): while one batch runs, the write of the last one's outcomes and the
    # claim of the next are in flight, so a thread that finishes starts its next job at once
    # instead of after a round-trip. None: enough that the pool and the room ahead hold three
    # claim batches, one batch at least: a full batch of outcomes waiting for its write counts
    # against them, and two batches of work are left, one running and one to start while the
    # write is in flight (a pool of 16 with one batch ahead had none left to start; a pool of 64
    # runs a batch while it writes, and two batches ahead cost it 8-12% beside a second process);
    # 0: claim for free threads only.
    claim_ahead: int | None = None
    # The longest a finished job's outcome waits for others before it is written (its slot is
    # held until then): a write goes at the earliest of a full batch, an idle pool and this.
    outcome_linger: float = DEFAULT_OUTCOME_LINGER
    poll_interval: float = 1.0
    lease_duration: float = DEFAULT_LEASE_DURATION
    heartbeat_interval: float | None = None  # None: lease_duration / 3
    maintenance_interval: float = 30.0  # seconds between this node's maintenance runs (lease expiry, schedules, retention)
    drain_timeout: float = 30.0
    # Seconds a cancelled running job's handler gets to notice and return before its attempt is
    # ended as cancelled without it (like a timeout: its thread's slot stays taken until it returns).
    cancel_grace: float = 5.0
    # The Django DATABASES alias whose jobs this group's pumps claim. None: the databases of the
    # backends that declare its queues (the worker places the group on each, see
    # backwave/databases.py). A plain name here: the core never opens a database.
    database: str | None = None
    retention: Retention = field(default_factory=Retention)  # cluster-wide: set from BACKWAVE["RETENTION"]

    @property
    def outcome_batch(self) -> int:
        """How many outcomes buffer before a write: max_outcome_batch, else max_claim_batch."""
        return self.max_outcome_batch if self.max_outcome_batch is not None else self.max_claim_batch

    @property
    def jobs_ahead(self) -> int:
        """How many claimed jobs may wait for a thread: claim_ahead, else what makes the pool and
        the room ahead three claim batches, one batch at least."""
        if self.claim_ahead is not None:
            return self.claim_ahead
        return max(self.max_claim_batch, 3 * self.max_claim_batch - self.pool_size)

    @property
    def heartbeat_every(self) -> float:
        """Seconds between lease renewals: heartbeat_interval, else a third of the lease."""
        return self.heartbeat_interval if self.heartbeat_interval is not None else self.lease_duration / 3.0

    @property
    def fault_backoff_cap(self) -> float:
        """The longest wait before retrying the store after faults in a row. Never past half a
        heartbeat: a renewal retried later than that could miss the lease's end after a short
        outage and self-fence for nothing."""
        return max(self.poll_interval, self.heartbeat_every / 2)


def validate_groups(groups: Iterable[WorkerGroupOptions]) -> list[WorkerGroupOptions]:
    """Reject what the seeds reject (a duplicate group name, fewer than one pump), then intervals
    a pump cannot run on: not a finite positive number of seconds, more than a week, or a
    heartbeat that would come after the pump stopped trusting its lease."""
    seen: set[str] = set()
    validated = []
    for group in groups:
        if group.name in seen:
            raise WorkerGroupConfigError(f"Worker Group '{group.name}' is configured twice.")
        if group.pumps < 1:
            raise WorkerGroupConfigError(f"Worker Group '{group.name}' must run at least one Pump (Pumps = {group.pumps}).")
        _check_intervals(group)
        _check_claim_ahead(group)
        seen.add(group.name)
        validated.append(group)
    return validated


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= MAX_INTERVAL


def _check_claim_ahead(group: WorkerGroupOptions) -> None:
    ahead = group.claim_ahead
    if ahead is not None and (isinstance(ahead, bool) or not isinstance(ahead, int) or not 0 <= ahead <= MAX_CLAIM_AHEAD):
        raise WorkerGroupConfigError(
            f"Worker Group '{group.name}': claim_ahead must be a whole number of jobs from 0 (claim for free threads only) "
            f"to {MAX_CLAIM_AHEAD:,}, or None (three claim batches with the pool, one at least), got {ahead!r}."
        )


def _check_intervals(group: WorkerGroupOptions) -> None:
    for name in (
        "poll_interval",
        "lease_duration",
        "heartbeat_interval",
        "maintenance_interval",
        "drain_timeout",
        "cancel_grace",
    ):
        value = getattr(group, name)
        if name == "heartbeat_interval" and value is None:
            continue
        if not _is_seconds(value):
            raise WorkerGroupConfigError(
                f"Worker Group '{group.name}': {name} must be a number of seconds above 0 and at most {MAX_INTERVAL:,.0f} "
                f"(a week), got {value!r}."
            )
    linger = group.outcome_linger
    if (
        isinstance(linger, bool)
        or not isinstance(linger, (int, float))
        or not math.isfinite(linger)
        or not 0 <= linger <= MAX_OUTCOME_LINGER
    ):
        raise WorkerGroupConfigError(
            f"Worker Group '{group.name}': outcome_linger must be a number of seconds from 0 (write each outcome at once) "
            f"to {MAX_OUTCOME_LINGER:g}, got {linger!r}."
        )
    trusted_for = group.lease_duration * (1.0 - SELF_FENCE_MARGIN)
    if group.heartbeat_every >= trusted_for:
        raise WorkerGroupConfigError(
            f"Worker Group '{group.name}': heartbeat_interval ({group.heartbeat_every:g} s) must be below "
            f"{1 - SELF_FENCE_MARGIN:.0%} of lease_duration ({trusted_for:g} of {group.lease_duration:g} s), where the pump "
            "stops trusting a lease it has not renewed; leave it None for a third of the lease."
        )


@dataclass(frozen=True, slots=True)
class StoreTimeouts:
    """The time limits every store statement of a worker process runs under, in seconds."""

    statement: float
    lock: float


def store_timeouts(
    groups: Iterable[WorkerGroupOptions], *, statement_timeout: float | None = None, lock_timeout: float | None = None
) -> StoreTimeouts:
    """The store's statement and lock timeouts for a process running ``groups`` (validated).

    None derives a value: the statement timeout from the shortest lease of the groups (of the
    default lease when there are none), the lock timeout from the statement timeout (see
    STATEMENT_TIMEOUT_SHARE_OF_LEASE for why). A value given must leave a renewal stuck behind
    a statement time to land: at most half the shortest lease of ``groups``; the lock timeout at
    most the statement timeout, which would cut a longer lock wait first anyway.
    """
    for setting, value in (("WORKER_STATEMENT_TIMEOUT", statement_timeout), ("WORKER_LOCK_TIMEOUT", lock_timeout)):
        if value is not None and not _is_seconds(value):
            raise WorkerGroupConfigError(
                f"BACKWAVE[{setting!r}] must be a number of seconds above 0 or None (derived from the lease), got {value!r}."
            )
    shortest = min(groups, key=lambda group: group.lease_duration, default=None)
    if statement_timeout is None:
        lease = shortest.lease_duration if shortest is not None else DEFAULT_LEASE_DURATION
        statement_timeout = lease * STATEMENT_TIMEOUT_SHARE_OF_LEASE
    elif shortest is not None and statement_timeout > shortest.lease_duration / 2:
        raise WorkerGroupConfigError(
            f"BACKWAVE['WORKER_STATEMENT_TIMEOUT'] ({statement_timeout:g} s) must be at most half the lease_duration of "
            f"Worker Group '{shortest.name}' ({shortest.lease_duration:g} s): a heartbeat waiting behind a statement that long "
            "would come too late to keep the lease. Lower it, lengthen the lease, or leave it None "
            "(a fifth of the shortest lease)."
        )
    if lock_timeout is None:
        lock_timeout = statement_timeout * LOCK_TIMEOUT_SHARE_OF_STATEMENT
    elif lock_timeout > statement_timeout:
        raise WorkerGroupConfigError(
            f"BACKWAVE['WORKER_LOCK_TIMEOUT'] ({lock_timeout:g} s) must be at most the statement timeout ({statement_timeout:g} s), "
            "which cuts a longer lock wait first. Lower it, or leave it None (a third of the statement timeout)."
        )
    return StoreTimeouts(statement=float(statement_timeout), lock=float(lock_timeout))

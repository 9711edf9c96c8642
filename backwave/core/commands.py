"""Commands: what the Node Driver asks the shell to do, in order.

A command list is executed in order, and its results come back as events in that order. A
``ClaimJobs`` that follows a ``WriteOutcomes`` in one list was sized on the assumption that the
write lands first: the shell runs it only after the write (it may pipeline the two into one
round-trip) and, if the write fails, reports the claim as failed without running it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .jobs import ClaimedJob, Outcome
from .options import Retention

# Jobs of lapsed leases released per ExpireLeases; the rest wait for the next maintenance run.
EXPIRY_BATCH = 1000
# Statistics buckets one maintenance run deletes at most.
STATS_PURGE_BATCH = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenLease(Command):
    """Create a new lease for this pump (the shell mints its id)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimJobs(Command):
    """Claim up to ``limit`` due jobs from ``queues`` under the lease."""

    lease_id: uuid.UUID
    queues: tuple[str, ...]
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteJob(Command):
    """Run this job's handler off the loop; report a JobFinished when it ends."""

    job: ClaimedJob


@dataclass(frozen=True, slots=True, kw_only=True)
class StopAttempt(Command):
    """Tell this attempt's handler to stop (its context's ``should_stop()`` turns true): it ran
    past its time limit, or was cancelled. Not a store command: the shell flags the handler,
    and with hard limits replaces a process whose handler does not return."""

    job_id: int
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOutcomes(Command):
    """Apply these outcomes in one fenced batch write."""

    lease_id: uuid.UUID
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RenewLease(Command):
    """Heartbeat: push the lease's expiry forward."""

    lease_id: uuid.UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireLeases(Command):
    """Maintenance: release up to ``limit`` jobs of leases that lapsed (anyone's)."""

    limit: int = EXPIRY_BATCH


@dataclass(frozen=True, slots=True, kw_only=True)
class MintSchedules(Command):
    """Maintenance: mint the due slot of every due schedule as a job, each slot once (cluster-wide).

    The shell evaluates the cron expressions against the database clock; the driver only says when.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeJobs(Command):
    """Maintenance: delete up to ``limit`` finished jobs older than ``retention`` allows (one batch)."""

    retention: Retention
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RollUpStats(Command):
    """Maintenance: fold up to ``limit`` finished attempts into the per-task statistics (one page,
    past the rollup's watermark)."""

    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AnalyzeTables(Command):
    """Maintenance: ANALYZE BackWave's busy tables whose planner statistics fell behind their
    changes, when autovacuum has not (it may be off, or slow to get to them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgePumps(Command):
    """Maintenance: forget the health rows of pumps silent for ``older_than`` seconds."""

    older_than: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeTaskStats(Command):
    """Maintenance: delete up to ``limit`` per-task statistics buckets past their resolution's
    retention, ``older_than`` as (bucket width, seconds kept) pairs. Unpaged: a minute adds one
    bucket per task, so one bounded run a maintenance interval outpaces their growth."""

    older_than: tuple[tuple[int, float], ...]
    limit: int = STATS_PURGE_BATCH


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseJobs(Command):
    """Give these unfinished jobs back, ready to run at once."""

    lease_id: uuid.UUID
    job_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileLease(Command):
    """Give back every job running under the lease whose (job id, attempt) is not in ``known``:
    after a claim whose reply was lost, the claim may have committed jobs this pump never heard
    of, or taken a job it still holds an outcome of back as the next attempt (a retry due at once
    whose write committed with it). Pairs, not ids: that later attempt runs nowhere."""

    lease_id: uuid.UUID
    known: tuple[tuple[int, int], ...]  # (job id, attempt) of every job the driver holds


@dataclass(frozen=True, slots=True, kw_only=True)
class ForgetOverruns(Command):
    """These handlers, whose attempts ended past their deadline and went out flagged overrun,
    have returned: they count against their queue's and key's limits no more."""

    lease_id: uuid.UUID
    attempts: tuple[tuple[int, int], ...]  # (job id, attempt)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseLease(Command):
    """Give back everything still running under the lease, then delete the lease."""

    lease_id: uuid.UUID

"""The Storage Contract: every database operation the engine performs, one method each.

Each method is one SQL statement (one round-trip); batch methods take sequences and are named
``*_many``. Methods that change rows under a lease return the ids they really changed: an id
missing from the answer means the writer no longer held that row's lease, which the driver treats
as an event, not a crash.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from backwave.core.jobs import ClaimedJob, OutcomeKind


class StoreError(Exception):
    """A store operation failed in a way the shell cannot classify as transient."""


class TransientStoreError(StoreError):
    """Connection lost, server restarting, serialization failure, lock or statement timeout:
    the pump marks itself degraded and retries on a later tick."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """A job to insert. Validated by the caller (the tasks backend) before it gets here."""

    task_path: str
    payload: dict[str, Any]
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None  # None: due at once (database clock)
    max_attempts: int = 1
    backoff_base: float = 1.0
    backoff_max: float = 3600.0
    backend: str = "default"
    tags: Sequence[str] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeRecord:
    """An outcome as written: the driver's verdict plus the shell's side channel."""

    job_id: int
    attempt: int
    kind: OutcomeKind
    retry_delay: float | None = None
    return_value: Any = None  # JSON-able; SUCCEEDED only
    error_class: str = ""
    traceback: str = ""
    duration: float = 0.0  # seconds the attempt ran, measured on the worker's monotonic clock


class Store(Protocol):
    """What a pump needs from the database. Implementations: PostgresStore (production)."""

    def open_lease(self, *, lease_id: uuid.UUID, worker_id: str, group: str, hostname: str, pid: int, duration: float) -> None:
        """Create the pump's lease, expiring ``duration`` seconds from now by the database clock."""

    def renew_lease(self, *, lease_id: uuid.UUID, duration: float) -> bool:
        """Push the lease's expiry to now + duration. False when the lease is gone (it lapsed and
        was expired by maintenance, or was released) or has already lapsed: a lapsed lease is
        never revived, since the fence has refused its writes from the moment it lapsed."""

    def release_lease(self, *, lease_id: uuid.UUID) -> list[int]:
        """Put every job still running under the lease back to ready (refunding the attempt, due
        at once) and delete the lease. Returns the released job ids."""

    def claim_jobs(self, *, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Lock up to ``limit`` due ready jobs of ``queues`` (priority, run_at, id order), skipping
        rows other claimers hold, and put them under the lease. Returns at once, short or empty
        when fewer are ready, and empty when the lease is gone or lapsed (no job is ever put under
        a lease that maintenance could not expire)."""

    def write_outcomes_many(self, *, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> set[int]:
        """Apply outcomes, each fenced: a row changes only if it is still running under this live
        lease at this attempt. Inserts one Attempt row per applied outcome. Returns applied ids.
        A SUCCEEDED outcome stores its return value as JSON (None becomes JSON null); other kinds
        store no return value (SQL NULL)."""

    def write_outcomes_then_claim(
        self, *, lease_id: uuid.UUID, worker_id: str, outcomes: Sequence[OutcomeRecord], queues: Sequence[str], limit: int
    ) -> tuple[set[int], list[ClaimedJob]]:
        """write_outcomes_many, then claim_jobs, in ONE round-trip, the claim strictly after the
        write; if the write fails the claim does not run. How a pump at steady state spends one
        round-trip per batch."""

    def release_jobs_many(self, *, lease_id: uuid.UUID, job_ids: Sequence[int]) -> set[int]:
        """Give unfinished jobs back (ready, due now, attempt refunded), fenced like outcomes."""

    def expire_leases(self, *, limit: int) -> int:
        """Delete up to ``limit`` leases whose expiry passed (database clock) and release their
        running jobs: ready again, or failed with a 'lease lapsed' attempt when none are left.
        Returns the number of jobs released."""

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[int]:
        """Insert jobs in one statement; returns their ids in input order."""

    def close(self) -> None:
        """Close the connection."""

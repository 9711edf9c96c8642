"""Values the driver and the store exchange: a claimed job and the outcome decided for it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


# The per-job values (this, Outcome, OutcomeRecord) are not frozen, as the shell's AttemptReport
# is not: one of each is built for every job, and a frozen dataclass's __init__ sets each field
# through object.__setattr__. Made plain, the three took a median 0.89x the worker's CPU per no-op
# job (18 within-round pairs of bench/throughput.py against the frozen build, 0.62-1.33x, 14 below
# 1, on a 2-core VM whose speed drifted). Nothing changes one once built: build another with
# dataclasses.replace(). Events and commands stay frozen.
@dataclass(slots=True, kw_only=True)
class ClaimedJob:
    """A job row as a claim returns it: now running under the claimer's lease."""

    id: int
    task_path: str
    queue: str
    priority: int
    payload: Any  # decoded JSON; the shell checks its shape before running anything
    attempt: int  # this attempt's number, 1 for the first run (counted at claim)
    max_attempts: int  # the limit on counted attempts: attempt - forgiven_attempts
    backoff_base: float
    backoff_max: float
    backend: str = "default"
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    attempted_at: datetime | None = None  # database clock, stamped by the claim
    previous_worker_ids: tuple[str, ...] = ()  # who ran the earlier attempts, oldest first
    # Earlier attempts that lapsed with their worker and were not counted (see expire_leases).
    forgiven_attempts: int = 0
    suspect: bool = False  # its last attempt lapsed with its worker: the only suspect of this pump
    # Seconds this attempt may run (the task's or the enqueue's limit); None: no limit.
    timeout: float | None = None
    # Who asked to cancel the job while it ran, when its attempt ended without an outcome (its
    # worker died, or it was given back): the claim cancels it instead of running it again.
    cancel_requested_by: str | None = None
    # The W3C trace context captured at enqueue (traceparent, tracestate), or None; the shell
    # makes it the parent of the attempt's span. Opaque here.
    trace_context: Any = field(default=None, compare=False, repr=False)

    @property
    def counted_attempt(self) -> int:
        """This attempt's number among the attempts that count against max_attempts."""
        return self.attempt - self.forgiven_attempts


class OutcomeKind(enum.Enum):
    """What an attempt's end does to its job."""

    SUCCEEDED = "succeeded"  # job done
    RETRY = "retry"  # attempt failed, job ready again after a backoff
    FAILED = "failed"  # attempt failed and no attempts are left: job dead
    QUARANTINED = "quarantined"  # unroutable: unknown task or undecodable payload; kept, never retried
    CANCELLED = "cancelled"  # an operator or the API cancelled the job while it ran: never retried
    SNOOZED = "snoozed"  # the handler asked to run again later: ready after retry_delay, attempt not counted


@dataclass(slots=True, kw_only=True)  # not frozen: see ClaimedJob
class Outcome:
    """The driver's verdict on one finished attempt, waiting to be written."""

    job_id: int
    attempt: int
    kind: OutcomeKind
    retry_delay: float | None = None  # seconds from the write, by the database clock; RETRY and SNOOZED
    # Why the driver, not the handler, ended the attempt ("timeout", or "cancelled by ..."): the
    # shell writes the error text from it. Empty when the handler's own report says what happened.
    reason: str = ""
    # Its handler still ran when the batch went out (ended past its deadline): the store counts
    # it against its limits until ForgetOverruns. Set by the write, not the decision (core/overruns.py).
    overrun: bool = False
    # The JobFinished's report, handed back to the shell with the WriteOutcomes; never looked
    # into here, and left out of equality and repr so traces stay what they were.
    report: object = field(default=None, compare=False, repr=False)

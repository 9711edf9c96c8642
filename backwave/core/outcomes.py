"""What a finished attempt turns into: the Node Driver's verdict, decided before any change so a
refused JobFinished leaves no trace.

Counted attempts: a worker that dies takes every job under its lease down, so expiry forgives
the first lapse since a job's last outcome (store/queries.sql, expire_leases) and marks it
suspect. A ClaimedJob carries its ``forgiven_attempts``; the driver decides FAILED against
``max_attempts`` and sizes a retry's backoff on ``counted_attempt`` (attempt - forgiven), never
on the raw attempt number. Which jobs may share a pump (at most one suspect per lease) is the
claim statement's rule, not the driver's: the store sees every row under the lease, those of a
claim in flight, a claim whose reply was lost or an outcome not yet written included, so no
event, command or driver state exists for it.

Reports: a JobFinished may carry the shell's report of the attempt, which the driver never looks
into. It rides on the Outcome it decides, through the buffer and into WriteOutcomes, where the
shell takes it back to write the record and signal the result. Whatever drops an outcome (a lost
lease clears the buffer, a claim makes a buffered one obsolete) drops its report with it, and a
JobFinished of an abandoned attempt leaves nothing behind, so the shell needs no map of reports.

Buffering: decided outcomes wait in an ``OutcomeBuffer`` and are written a batch at a time, one
write in flight at most. Each, waiting or being written, still holds its job's slot, because it
still holds its lease.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from . import commands as cmd
from . import events as ev
from .backoff import bounded_delay, retry_delay
from .jobs import ClaimedJob, Outcome, OutcomeKind
from .ledger import Ledger
from .options import WorkerGroupOptions
from .overruns import Overruns

RESULTS = ("succeeded", "failed", "unroutable", "discarded", "snoozed", "cancelled", "committed")

# Weight of the newest sample in a learned average (a write's round-trip, a task's duration).
LEARNING_WEIGHT = 0.25

# Handed to the backoff of an attempt the driver ends itself (a timeout): no event brings a
# draw, and the middle of the range is the nominal delay.
TIMEOUT_JITTER = 0.5


def decide(job: ClaimedJob, event: ev.JobFinished, *, cancelled_by: str | None = None) -> Outcome:
    """The outcome of ``job``'s attempt that ``event`` reports; ValueError when it cannot be
    decided (an unknown result, a jitter outside [0, 1), a delay that is not a finite number of
    seconds >= 0, a snooze without one). A delay past MAX_DELAY (a task's backoff() answering
    1e15) is cut to it. ``cancelled_by``: the job's cancel was requested while the attempt ran,
    so it ends cancelled however its handler ended."""
    if event.result not in RESULTS:
        raise ValueError(f"unknown result {event.result!r}")
    delay = event.delay
    if delay is not None and not (isinstance(delay, (int, float)) and math.isfinite(delay) and delay >= 0):
        raise ValueError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
    if event.result == "snoozed" and delay is None:
        raise ValueError("a snoozed attempt needs a delay")
    if delay is not None:
        delay = bounded_delay(delay)
    decided = {"job_id": job.id, "attempt": job.attempt, "report": event.report}
    if event.result == "committed":
        # Already written by the attempt, in the transaction of its effects: a cancel that came
        # meanwhile is too late to change it.
        return Outcome(**decided, kind=OutcomeKind.SUCCEEDED)
    if cancelled_by is not None or event.result == "cancelled":
        return Outcome(**decided, kind=OutcomeKind.CANCELLED, reason=cancel_reason(cancelled_by))
    if event.result == "succeeded":
        return Outcome(**decided, kind=OutcomeKind.SUCCEEDED)
    if event.result == "unroutable":
        return Outcome(**decided, kind=OutcomeKind.QUARANTINED)
    if event.result == "snoozed":
        # Not a failure: the store leaves the attempt out of the limit (forgiven_attempts).
        return Outcome(**decided, kind=OutcomeKind.SNOOZED, retry_delay=float(delay))
    if event.result == "discarded":
        return Outcome(**decided, kind=OutcomeKind.FAILED)
    return _failure(job, decided, jitter=event.jitter, delay=delay)


def timed_out(job: ClaimedJob) -> Outcome:
    """The outcome of an attempt that ran past its time limit: a failed attempt under the job's
    retry rules (the task's backoff callable cannot be asked: its handler is still running)."""
    return _failure(job, {"job_id": job.id, "attempt": job.attempt}, jitter=TIMEOUT_JITTER, delay=None, reason="timeout")


def cancel_ignored(job: ClaimedJob, by: str) -> Outcome:
    """The outcome of a cancelled attempt whose handler did not return within cancel_grace."""
    return Outcome(
        job_id=job.id,
        attempt=job.attempt,
        kind=OutcomeKind.CANCELLED,
        reason=cancel_reason(by) + " (its handler did not stop in time)",
    )


def cancelled_before_start(job: ClaimedJob, *, by: str | None = None) -> Outcome:
    """A claimed job whose cancel was requested (``by``, else while an earlier attempt of it
    ran) before this attempt started: it waited for a thread, claimed ahead, or was cancelled
    before it was claimed again."""
    by = by if by is not None else job.cancel_requested_by
    return Outcome(
        job_id=job.id,
        attempt=job.attempt,
        kind=OutcomeKind.CANCELLED,
        reason=cancel_reason(by) + " (before this attempt started)",
    )


def cancel_reason(by: str | None) -> str:
    return f"cancelled by {by}" if by else "cancelled"


def _failure(job: ClaimedJob, decided: dict, *, jitter: float, delay: float | None, reason: str = "") -> Outcome:
    # Attempts forgiven after a lapse (the job may only have been beside a worker's death) or
    # snoozed count neither towards the limit nor towards the backoff.
    if job.counted_attempt >= job.max_attempts:
        return Outcome(**decided, kind=OutcomeKind.FAILED, reason=reason)
    if delay is None:
        delay = retry_delay(attempt=job.counted_attempt, base=job.backoff_base, cap=job.backoff_max, jitter=jitter)
    return Outcome(**decided, kind=OutcomeKind.RETRY, retry_delay=float(delay), reason=reason)


@dataclass
class OutcomeBuffer:
    options: WorkerGroupOptions
    ledger: Ledger  # the driver's: every WriteOutcomes is sent through it
    waiting: deque[Outcome] = field(default_factory=deque)
    # When the oldest outcome waiting began to wait (meaningful while any waits), and the
    # earliest a lingered write may go after a failed one (its fault backoff).
    waiting_since: float = 0.0
    not_before: float = 0.0
    round_trip: float | None = None  # a write's learned round-trip (None until one landed)
    overruns: Overruns | None = None  # the driver's: which handlers outlive their ended attempt
    # Outcomes that came back busy (another transaction held their job's row), by job id: the
    # earliest the next write may carry them. They wait in ``waiting`` like any other.
    held_back: dict[int, float] = field(default_factory=dict)

    def add(self, outcome: Outcome, now: float) -> None:
        if not self.waiting:
            self.waiting_since = now
        self.waiting.append(outcome)

    def writable(self, now: float) -> int:
        """How many outcomes waiting a write sent now would carry (busy ones only once due)."""
        if not self.held_back:
            return len(self.waiting)
        return sum(1 for o in self.waiting if self.held_back.get(o.job_id, now) <= now)

    @property
    def held_back_due(self) -> float | None:
        """When the first busy outcome may go again; None while none waits for that."""
        return min(self.held_back.values()) if self.held_back else None

    @property
    def linger_due(self) -> float | None:
        """When the outcomes waiting have lingered long enough to be written without a full
        batch or an idle pool (busy ones: once due again); None while none waits or a write is
        in flight."""
        if not self.waiting or self.writing:
            return None
        due = max(self.waiting_since + self.options.outcome_linger, self.not_before)
        if self.held_back and all(o.job_id in self.held_back for o in self.waiting):
            due = max(due, min(self.held_back.values()))
        return due

    @property
    def writing(self) -> tuple[Outcome, ...]:
        """The outcomes of the write in flight."""
        write = self.ledger.oldest(cmd.WriteOutcomes)
        return write.outcomes if write else ()

    @property
    def full(self) -> bool:
        return len(self.waiting) >= self.options.outcome_batch

    def attempts(self) -> set[tuple[int, int]]:
        """(job id, attempt) of every outcome waiting or being written."""
        return {(o.job_id, o.attempt) for o in (*self.waiting, *self.writing)}

    def write(self, now: float, lease_id: uuid.UUID | None) -> list[cmd.Command]:
        """The next batch's WriteOutcomes; none while one is in flight or while nothing waits.
        Each outcome is flagged overrun as its handler is then (core/overruns.py)."""
        if self.writing or not self.waiting:
            return []
        if self.held_back:
            batch, kept = self._take_writable(now)
            if not batch:
                return []
            self.waiting = kept
        else:
            batch = tuple(self.waiting.popleft() for _ in range(min(len(self.waiting), self.options.outcome_batch)))
        if self.overruns is not None:
            batch = self.overruns.flag(batch)
        self.waiting_since = now  # what is left (past a full batch) lingers from this write on
        return [self.ledger.send(cmd.WriteOutcomes(lease_id=lease_id, outcomes=batch), now)]

    def _take_writable(self, now: float) -> tuple[tuple[Outcome, ...], deque[Outcome]]:
        """The next batch, in buffer order, passing over busy outcomes not due yet; and what stays."""
        batch: list[Outcome] = []
        kept: deque[Outcome] = deque()
        for outcome in self.waiting:
            if len(batch) < self.options.outcome_batch and self.held_back.get(outcome.job_id, now) <= now:
                self.held_back.pop(outcome.job_id, None)
                batch.append(outcome)
            else:
                kept.append(outcome)
        return tuple(batch), kept

    def written(self, now: float, busy: Collection[int] = ()) -> None:
        """The write in flight landed; its ``busy`` outcomes wait again, due after poll_interval."""
        write, sent_at = self.ledger.landed(cmd.WriteOutcomes)
        if now >= sent_at:
            self.round_trip = learned(self.round_trip, now - sent_at)
        if busy:
            again = [o for o in write.outcomes if o.job_id in busy]
            if not self.waiting:
                self.waiting_since = now
            self.waiting.extendleft(reversed(again))
            for outcome in again:
                self.held_back[outcome.job_id] = now + self.options.poll_interval

    def write_failed(self, retry_at: float) -> None:
        # Nothing was written: the batch goes back to the front, to be written once later, and
        # no sooner than the fault's backoff allows (a lingered write would not wait for it).
        write, _ = self.ledger.failed(cmd.WriteOutcomes)
        self.waiting.extendleft(reversed(write.outcomes))
        self.not_before = retry_at

    def of_jobs(self, job_ids: Collection[int]) -> int:
        """How many waiting outcomes are of ``job_ids``."""
        return sum(1 for o in self.waiting if o.job_id in job_ids)

    def drop(self, job_ids: Collection[int]) -> None:
        self.waiting = deque(o for o in self.waiting if o.job_id not in job_ids)
        for job_id in job_ids:
            self.held_back.pop(job_id, None)

    def clear(self) -> None:
        self.waiting.clear()
        self.held_back.clear()


def learned(average: float | None, sample: float) -> float:
    return sample if average is None else average + LEARNING_WEIGHT * (sample - average)

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
"""

from __future__ import annotations

from . import events as ev
from .backoff import retry_delay
from .jobs import ClaimedJob, Outcome, OutcomeKind

RESULTS = ("succeeded", "failed", "unroutable")


def decide(job: ClaimedJob, event: ev.JobFinished) -> Outcome:
    """The outcome of ``job``'s attempt that ``event`` reports; ValueError when it cannot be
    decided (an unknown result, a jitter outside [0, 1))."""
    if event.result not in RESULTS:
        raise ValueError(f"unknown result {event.result!r}")
    decided = {"job_id": job.id, "attempt": job.attempt, "report": event.report}
    if event.result == "succeeded":
        return Outcome(**decided, kind=OutcomeKind.SUCCEEDED)
    if event.result == "unroutable":
        return Outcome(**decided, kind=OutcomeKind.QUARANTINED)
    # Attempts forgiven after a lapse (the job may only have been beside a worker's death) count
    # neither towards the limit nor towards the backoff.
    if job.counted_attempt >= job.max_attempts:
        return Outcome(**decided, kind=OutcomeKind.FAILED)
    delay = retry_delay(attempt=job.counted_attempt, base=job.backoff_base, cap=job.backoff_max, jitter=event.jitter)
    return Outcome(**decided, kind=OutcomeKind.RETRY, retry_delay=delay)

"""What a finished attempt turns into: the Node Driver's verdict, decided before any change so a
refused JobFinished leaves no trace."""

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

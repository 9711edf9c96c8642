"""``backwave.cancel(result_id)``: cancel a job from code, as the admin's Cancel does.

A ready (due or scheduled) job, or a workflow's waiting or held one, is cancelled at once (its
dependents follow their on_failure). A running one gets a cancel request: its
worker hears of it within moments (a NOTIFY sent when the caller's transaction commits, with
the heartbeat as the safety net), its handler's ``context.should_stop()`` turns true, and the
attempt ends cancelled, by the time ``cancel_grace`` has passed at the latest. Runs on the
backend's database connection, inside the caller's transaction if there is one.
"""

from __future__ import annotations

import enum

from django.tasks.exceptions import TaskResultDoesNotExist

MAX_JOB_ID = 2**63 - 1
MAX_BY_LENGTH = 255  # Job.cancel_requested_by


class Cancellation(enum.StrEnum):
    """What ``cancel()`` did."""

    CANCELLED = "cancelled"  # it had not started: cancelled now
    REQUESTED = "requested"  # it runs: its worker is asked to stop it, and ends it cancelled
    FINISHED = "finished"  # it had already finished (or was cancelled before): nothing to do


def cancel(result_id: int | str, *, by: str = "api", backend: str = "default") -> Cancellation:
    """Cancel the job of ``result_id`` (a TaskResult's id) on the BackWave backend ``backend``;
    ``by`` names who cancels in the attempt's error. TaskResultDoesNotExist when no such job;
    ValueError, before anything is written, for a ``by`` its column cannot hold."""
    from django.tasks import task_backends

    from ..ops import actions
    from ..store.storable import text_problem

    if not isinstance(by, str) or not 1 <= len(by) <= MAX_BY_LENGTH or text_problem(by):
        raise ValueError(
            f"by of backwave.cancel() must be a string of 1 to {MAX_BY_LENGTH} characters without a NUL or a lone surrogate "
            f"(who cancels, as the attempt's error names it), got {by!r:.300}"
        )

    text = str(result_id)
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_JOB_ID:
        raise TaskResultDoesNotExist(result_id)
    database = getattr(task_backends[backend], "database", None)
    if database is None:
        raise ValueError(f"backend {backend!r} is not a BackWave backend; backwave.cancel() cancels BackWave jobs only")
    result = actions.cancel_job_ids([int(text)], by=by, running=True, using=database)
    if result.gone:
        raise TaskResultDoesNotExist(result_id)
    if result.requested:
        return Cancellation.REQUESTED
    return Cancellation.CANCELLED if result.changed else Cancellation.FINISHED

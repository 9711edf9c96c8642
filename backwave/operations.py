"""What an operator can do to jobs, queues and schedules: one statement each.

The admin's actions and ``manage.py backwave_queue`` call these; they never touch a row a worker
holds. Each job operation is one conditional UPDATE whose WHERE clause is the rule ("failed or
quarantined", "ready"), so a job a worker claims between the page load and the click is left
alone: the claim holds the row lock, the UPDATE waits for it, re-reads the row (READ COMMITTED)
and finds it running. The same statement reports, per state, what it changed and what it refused,
so the message the operator sees is exact even under that race.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from django.db import connections, router
from django.db.models.functions import Now

from .models import Job, Queue

RETRYABLE_STATES = ("failed", "quarantined")
CANCELLABLE_STATES = ("ready",)
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobActionResult:
    """What a job operation did: ids it changed, and the states of those it refused."""

    changed: tuple[int, ...] = ()
    refused: Counter = field(default_factory=Counter)  # state at the time of the statement -> count

    @property
    def refused_running(self) -> int:
        return self.refused.get("running", 0)


# Retry: "max_attempts = greatest(max_attempts, attempts - forgiven_attempts + 1)" grants the one
# more attempt that "retry now" promises even when the job used all of its attempts (as Oban's
# retry_job does); attempts forgiven after a lapse never counted, so they are left out here as
# they are everywhere the limit is checked. Attempt numbers keep counting up, so the attempt log
# keeps every earlier try.
_RETRY_SET = """
    state = 'ready', run_at = now(), finished_at = NULL, return_value = NULL,
    max_attempts = greatest(j.max_attempts, j.attempts - j.forgiven_attempts + 1)
"""
_CANCEL_SET = "state = 'cancelled', finished_at = now()"

# "target" reads the selected rows' states in the statement's snapshot; "changed" updates those
# still in an allowed state. Rows a claim locked meanwhile are re-checked by the UPDATE after
# the lock is released, found running, and land in "refused" with their snapshot state, which
# the caller reports as running when it was ready (see _classify).
_JOB_ACTION_SQL = """
WITH target AS MATERIALIZED (
    SELECT j.id, j.state FROM backwave_job AS j WHERE j.id IN ({selection})
), changed AS (
    UPDATE backwave_job AS j
    SET {assignments}
    FROM target AS t
    WHERE j.id = t.id AND j.state = ANY(%s)
    RETURNING j.id
)
SELECT t.id, t.state, c.id IS NOT NULL
FROM target AS t LEFT JOIN changed AS c ON c.id = t.id
ORDER BY t.id
"""


def _job_action(queryset, assignments: str, allowed: tuple[str, ...]) -> JobActionResult:
    selection = queryset.order_by().values("id")
    using = selection.db
    sql, params = selection.query.sql_with_params()
    with connections[using].cursor() as cursor:
        cursor.execute(_JOB_ACTION_SQL.format(selection=sql, assignments=assignments), [*params, list(allowed)])
        rows = cursor.fetchall()
    changed = tuple(job_id for job_id, _state, done in rows if done)
    refused = Counter(_refused_state(state, allowed) for _job_id, state, done in rows if not done)
    return JobActionResult(changed=changed, refused=refused)


def _refused_state(state: str, allowed: tuple[str, ...]) -> str:
    # Allowed in the snapshot yet not changed: a worker claimed it in between, so it is running.
    return "running" if state in allowed else state


def retry_jobs(queryset) -> JobActionResult:
    """Make failed and quarantined jobs of ``queryset`` ready now, with one more attempt."""
    return _job_action(queryset, _RETRY_SET, RETRYABLE_STATES)


def cancel_jobs(queryset) -> JobActionResult:
    """Cancel the ready (due or scheduled) jobs of ``queryset``; running ones are left alone."""
    return _job_action(queryset, _CANCEL_SET, CANCELLABLE_STATES)


def retry_job_ids(ids) -> JobActionResult:
    return retry_jobs(Job.objects.filter(id__in=list(ids)))


def cancel_job_ids(ids) -> JobActionResult:
    return cancel_jobs(Job.objects.filter(id__in=list(ids)))


# --- queues -------------------------------------------------------------------------------------


def validate_queue_name(name) -> str:
    """The name, or ValueError saying what a queue name may be."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise ValueError(f"Invalid queue name {name!r}: use 1 to 64 letters, digits, '_', '.' or '-'.")
    return name


def validate_concurrency_limit(limit) -> int | None:
    """The limit (None: unlimited), or ValueError saying what is allowed."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"Invalid concurrency limit {limit!r}: use a whole number >= 1, or none for unlimited.")
    return limit


def _upsert_queues(names, **values) -> int:
    """Write ``values`` into the Queue rows of ``names``, creating the missing rows (one statement)."""
    names = sorted({validate_queue_name(name) for name in names})
    if not names:
        return 0
    rows = [Queue(name=name, **values) for name in names]
    # updated_at is left out of the objects, so the INSERT writes its db_default (the database
    # clock) and the conflict branch copies it from EXCLUDED.
    Queue.objects.db_manager(router.db_for_write(Queue)).bulk_create(
        rows, update_conflicts=True, unique_fields=["name"], update_fields=[*values, "updated_at"]
    )
    return len(names)


def pause_queues(names) -> int:
    """Pause queues by name: workers stop claiming from them; running jobs finish."""
    return _upsert_queues(names, paused=True)


def resume_queues(names) -> int:
    """Resume paused queues by name."""
    return _upsert_queues(names, paused=False)


def limit_queues(names, limit: int | None) -> int:
    """Set the cluster-wide concurrency limit of queues by name (None: unlimited)."""
    return _upsert_queues(names, concurrency_limit=validate_concurrency_limit(limit))


def apply_queue_settings(settings_queues) -> int:
    """Write BACKWAVE["QUEUES"] (validated by conf) into the queues' rows: a worker's start-up.
    Only the keys a queue's entry names are written; the rest keep what the admin set."""
    written = 0
    for name, spec in settings_queues.items():
        values = {key: spec[key] for key in ("concurrency_limit", "paused") if key in spec}
        if values:
            written += _upsert_queues([name], **values)
    return written


# --- schedules ----------------------------------------------------------------------------------


def set_schedules_enabled(queryset, enabled: bool) -> int:
    """Enable or disable schedules. ``next_run`` goes back to NULL either way, as when a worker
    re-syncs them: a re-enabled schedule starts at its next slot and never catches up."""
    return queryset.filter(enabled=not enabled).update(enabled=enabled, next_run=None, updated_at=Now())


"""What an operator can do to jobs, queues and schedules: one statement each.

The admin's actions and ``manage.py backwave_queue`` call these; they never touch a row a worker
holds. Each job operation is one statement that first locks the selected rows in id order
(``ORDER BY id FOR UPDATE``), then applies its rule ("failed or quarantined", "ready") to what it
locked. The order is what keeps two operators' overlapping actions from deadlocking: whatever
plan each statement gets, both take their locks in the same order, so one simply waits for the
other. The lock is also what makes the report exact under a race: a row a worker claims between
the page load and the click is re-read once the claim's lock is gone and found running; a row
the retention purge deleted meanwhile is skipped, and reported gone when it was asked for by id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.db import connections, router

from .models import Job, Queue
from .queue_rules import CONCURRENCY_LIMIT_RULE, QUEUE_NAME_RULE, is_concurrency_limit, is_queue_name

RETRYABLE_STATES = ("failed", "quarantined")
CANCELLABLE_STATES = ("ready",)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobActionResult:
    """What a job operation did: ids it changed, the states of those it refused, and the ids
    asked for by id that no longer exist."""

    changed: tuple[int, ...] = ()
    refused: Counter = field(default_factory=Counter)  # state when locked -> count
    gone: tuple[int, ...] = ()

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

# "target" locks the selected rows in id order (the ORDER BY is applied before the locks are
# taken) and reads each one's state as it is once locked: after waiting for a worker's claim,
# the row it re-reads is running; a row deleted while it waited is skipped. "changed" updates the
# locked rows that are in an allowed state; nobody else can change them in between.
_JOB_ACTION_SQL = """
WITH target AS MATERIALIZED (
    SELECT j.id, j.state FROM backwave_job AS j WHERE j.id IN ({selection})
    ORDER BY j.id
    FOR UPDATE OF j
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


def _selection_sql(queryset) -> tuple[str, str, tuple]:
    """(database alias, SQL, params) of the ids ``queryset`` selects, unordered."""
    selection = queryset.order_by().values("id")
    sql, params = selection.query.sql_with_params()
    return selection.db, sql, params


def _job_action(queryset, assignments: str, allowed: tuple[str, ...], requested=()) -> JobActionResult:
    using, sql, params = _selection_sql(queryset)
    with connections[using].cursor() as cursor:
        cursor.execute(_JOB_ACTION_SQL.format(selection=sql, assignments=assignments), [*params, list(allowed)])
        rows = cursor.fetchall()
    changed = tuple(job_id for job_id, _state, done in rows if done)
    refused = Counter(state for _job_id, state, done in rows if not done)
    gone = tuple(sorted(set(requested) - {job_id for job_id, _state, _done in rows}))
    return JobActionResult(changed=changed, refused=refused, gone=gone)


def retry_jobs(queryset) -> JobActionResult:
    """Make failed and quarantined jobs of ``queryset`` ready now, with one more attempt."""
    return _job_action(queryset, _RETRY_SET, RETRYABLE_STATES)


def cancel_jobs(queryset) -> JobActionResult:
    """Cancel the ready (due or scheduled) jobs of ``queryset``; running ones are left alone."""
    return _job_action(queryset, _CANCEL_SET, CANCELLABLE_STATES)


def retry_job_ids(ids) -> JobActionResult:
    """retry_jobs() on jobs by id; the result names the ids that no longer exist."""
    ids = list(ids)
    return _job_action(Job.objects.filter(id__in=ids), _RETRY_SET, RETRYABLE_STATES, requested=ids)


def cancel_job_ids(ids) -> JobActionResult:
    """cancel_jobs() on jobs by id; the result names the ids that no longer exist."""
    ids = list(ids)
    return _job_action(Job.objects.filter(id__in=ids), _CANCEL_SET, CANCELLABLE_STATES, requested=ids)


# --- queues -------------------------------------------------------------------------------------


def validate_queue_name(name) -> str:
    """The name, or ValueError saying what a queue name may be."""
    if not is_queue_name(name):
        raise ValueError(f"Invalid queue name {name!r}: use {QUEUE_NAME_RULE}.")
    return name


def validate_concurrency_limit(limit) -> int | None:
    """The limit (None: unlimited), or ValueError saying what is allowed."""
    if limit is None:
        return None
    if not is_concurrency_limit(limit):
        raise ValueError(f"Invalid concurrency limit {limit!r}: use {CONCURRENCY_LIMIT_RULE}, or none for unlimited.")
    return limit


def parse_concurrency_limit(text: str, *, unlimited: str) -> int | None:
    """A limit as an operator typed it: blank, "none" or "unlimited" is None, else ASCII digits
    within the column's range. ``unlimited`` says, in the error, how to ask for no limit."""
    text = text.strip()
    if text.lower() in ("", "none", "unlimited"):
        return None
    # ASCII only: int() also reads "٣" and " 1_000 ", and refuses "²" with a message about base 10.
    limit = int(text) if text.isascii() and text.isdigit() else None
    if limit is None or not is_concurrency_limit(limit):
        raise ValueError(f"Invalid concurrency limit {text!r}: use {CONCURRENCY_LIMIT_RULE}, or {unlimited} for unlimited.")
    return limit


def _upsert_queues(names, *, using: str | None = None, **values) -> int:
    """Write ``values`` into the Queue rows of ``names`` in database ``using`` (None: the router's
    choice), creating the missing rows (one statement)."""
    # Sorted: the upsert locks rows in the order of its VALUES, so overlapping actions lock in
    # the same order and one waits for the other instead of deadlocking.
    names = sorted({validate_queue_name(name) for name in names})
    if not names:
        return 0
    rows = [Queue(name=name, **values) for name in names]
    # updated_at is left out of the objects, so the INSERT writes its db_default (the database
    # clock) and the conflict branch copies it from EXCLUDED.
    Queue.objects.db_manager(using or router.db_for_write(Queue)).bulk_create(
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


def apply_queue_settings(settings_queues, *, database: str | None = None) -> int:
    """Write BACKWAVE["QUEUES"] (validated by conf) into the queues' rows of ``database`` (None:
    the Queue model's database): a worker's start-up, once per database it serves. Only the keys
    a queue's entry names are written; the rest keep what the admin set."""
    written = 0
    for name, spec in settings_queues.items():
        values = {key: spec[key] for key in ("concurrency_limit", "paused") if key in spec}
        if values:
            written += _upsert_queues([name], using=database, **values)
    return written


# --- schedules ----------------------------------------------------------------------------------


# Locks in id order for the same reason as the job actions; a schedule toggled meanwhile is
# re-read once locked and left alone when it is already as asked.
_SCHEDULES_ENABLED_SQL = """
WITH target AS MATERIALIZED (
    SELECT s.id FROM backwave_schedule AS s WHERE s.id IN ({selection}) AND s.enabled <> %s
    ORDER BY s.id
    FOR UPDATE OF s
)
UPDATE backwave_schedule AS s
SET enabled = %s, next_run = NULL, updated_at = now()
FROM target AS t
WHERE s.id = t.id
"""


def set_schedules_enabled(queryset, enabled: bool) -> int:
    """Enable or disable schedules. ``next_run`` goes back to NULL either way, as when a worker
    re-syncs them: a re-enabled schedule starts at its next slot and never catches up."""
    using, sql, params = _selection_sql(queryset)
    with connections[using].cursor() as cursor:
        cursor.execute(_SCHEDULES_ENABLED_SQL.format(selection=sql), [*params, enabled, enabled])
        return cursor.rowcount

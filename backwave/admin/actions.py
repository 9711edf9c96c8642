"""What an operator can do to jobs, queues and schedules: one statement each.

The admin's actions and ``manage.py backwave_queue`` call these; they never touch a row a worker
holds. Each turns its selection into the arguments of one statement of the store
(``backwave/store/operator.py``, SQL in ``queries.sql``). Each job operation is one statement that first locks the selected rows in id order
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

from ..models import Job, Queue
from ..observers import discovered as discovered_observers
from ..queue_rules import validate_concurrency_limit
from ..store import operator

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


def _selection(queryset) -> tuple[str, tuple[str, tuple]]:
    """(database alias, (SQL, params)) of the ids ``queryset`` selects, unordered."""
    selection = queryset.order_by().values("id")
    return selection.db, selection.query.sql_with_params()


def _job_action(queryset, action: str, allowed: tuple[str, ...], requested=()) -> JobActionResult:
    using, selection = _selection(queryset)
    with connections[using].cursor() as cursor:
        rows = operator.act_on_jobs(cursor, action, selection, allowed, observed=discovered_observers().observed)
    changed = tuple(job_id for job_id, _state, done in rows if done)
    refused = Counter(state for _job_id, state, done in rows if not done)
    gone = tuple(sorted(set(requested) - {job_id for job_id, _state, _done in rows}))
    return JobActionResult(changed=changed, refused=refused, gone=gone)


def retry_jobs(queryset) -> JobActionResult:
    """Make failed and quarantined jobs of ``queryset`` ready now, with one more attempt."""
    return _job_action(queryset, "retry", RETRYABLE_STATES)


def cancel_jobs(queryset) -> JobActionResult:
    """Cancel the ready (due or scheduled) jobs of ``queryset``; running ones are left alone."""
    return _job_action(queryset, "cancel", CANCELLABLE_STATES)


def retry_job_ids(ids) -> JobActionResult:
    """retry_jobs() on jobs by id; the result names the ids that no longer exist."""
    ids = list(ids)
    return _job_action(Job.objects.filter(id__in=ids), "retry", RETRYABLE_STATES, requested=ids)


def cancel_job_ids(ids) -> JobActionResult:
    """cancel_jobs() on jobs by id; the result names the ids that no longer exist."""
    ids = list(ids)
    return _job_action(Job.objects.filter(id__in=ids), "cancel", CANCELLABLE_STATES, requested=ids)


# --- queues -------------------------------------------------------------------------------------


def _upsert_queues(names, **values) -> int:
    with connections[router.db_for_write(Queue)].cursor() as cursor:
        return operator.upsert_queues(cursor, names, **values)


def pause_queues(names) -> int:
    """Pause queues by name: workers stop claiming from them; running jobs finish."""
    return _upsert_queues(names, paused=True)


def resume_queues(names) -> int:
    """Resume paused queues by name."""
    return _upsert_queues(names, paused=False)


def limit_queues(names, limit: int | None) -> int:
    """Set the cluster-wide concurrency limit of queues by name (None: unlimited)."""
    return _upsert_queues(names, concurrency_limit=validate_concurrency_limit(limit))


# --- schedules ----------------------------------------------------------------------------------


def set_schedules_enabled(queryset, enabled: bool) -> int:
    """Enable or disable schedules. ``next_run`` goes back to NULL either way, as when a worker
    re-syncs them: a re-enabled schedule starts at its next slot and never catches up."""
    using, selection = _selection(queryset)
    with connections[using].cursor() as cursor:
        return operator.set_schedules_enabled(cursor, selection, enabled)

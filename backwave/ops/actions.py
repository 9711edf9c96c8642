"""What an operator can do to jobs, queues and schedules: one statement each (a job action
over everything a filter matches: one statement per bounded batch, see ``act_on_matching``).

The admin's actions, ``manage.py backwave_queue`` and ``manage.py backwave_jobs`` call these; they never touch a row a worker
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
from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.exceptions import EmptyResultSet
from django.db import connections, router, transaction

from ..models import FINISHED_STATES, Job, Queue
from ..observers import discovered as discovered_observers
from ..queue_rules import validate_concurrency_limit
from ..store import operator

# A held job (its ancestor failed under on_failure="hold") may be run now by retrying it; a
# waiting or held job may be cancelled, and its dependents follow their on_failure.
RETRYABLE_STATES = ("failed", "quarantined", "held")
CANCELLABLE_STATES = ("ready", "waiting", "held")
PURGEABLE_STATES = tuple(sorted(FINISHED_STATES))
ALLOWED_STATES = {"retry": RETRYABLE_STATES, "cancel": CANCELLABLE_STATES, "purge": PURGEABLE_STATES}
# Jobs one statement of a bulk action locks and changes: each batch commits on its own, so a
# "retry all" over a million failed jobs never holds a million row locks, nor one long
# transaction that blocks vacuum, and what it did so far stays done if the request dies.
BATCH_SIZE = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class JobActionResult:
    """What a job operation did: ids it changed, the states of those it refused, and the ids
    asked for by id that no longer exist. ``changed_rows`` has (id, state before, task path)
    of each changed job, for the admin's history."""

    changed: tuple[int, ...] = ()
    refused: Counter = field(default_factory=Counter)  # state when locked -> count
    gone: tuple[int, ...] = ()
    changed_rows: tuple[tuple[int, str, str], ...] = ()
    batches: int = 0
    requested: tuple[int, ...] = ()  # of changed: running jobs whose workers were asked to stop them (a cancel)

    @property
    def refused_running(self) -> int:
        return self.refused.get("running", 0)

    def __add__(self, other: JobActionResult) -> JobActionResult:
        return JobActionResult(
            changed=self.changed + other.changed,
            refused=self.refused + other.refused,
            gone=self.gone + other.gone,
            changed_rows=self.changed_rows + other.changed_rows,
            batches=self.batches + other.batches,
            requested=self.requested + other.requested,
        )


# Called with each batch's result inside the batch's transaction (the admin writes its
# LogEntry rows there, so the history and the change commit together).
OnBatch = Callable[[JobActionResult], None]


def _selection(queryset) -> tuple[str, tuple[str, tuple] | None]:
    """(database alias, (SQL, params)) of the ids ``queryset`` selects, unordered; None for the
    SQL when it can select nothing (``none()``, an impossible search, no id at all), which
    Django refuses to compile (EmptyResultSet)."""
    selection = queryset.order_by().values("id")
    try:
        return selection.db, selection.query.sql_with_params()
    except EmptyResultSet:
        return selection.db, None


def _allowed(action: str, running: bool) -> tuple[str, ...]:
    # A cancel may also ask the workers of running jobs to stop them (cancel_running_job).
    return ALLOWED_STATES[action] + (("running",) if running and action == "cancel" else ())


def _run(
    using: str, action: str, selection, requested=(), on_batch: OnBatch | None = None, *, by: str = "admin", running: bool = False
) -> tuple[JobActionResult, int]:
    """One statement of ``action`` on ``selection``, in its own transaction: (result, the
    last id it locked, 0 when none). A cancel names who cancels (``by``)."""
    allowed = _allowed(action, running)
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            observed = discovered_observers().observed
            if action == "cancel":
                rows = operator.cancel_jobs(cursor, selection, by=by, allowed=allowed, observed=observed)
            else:
                rows = operator.act_on_jobs(cursor, action, selection, allowed, observed=observed)
        result = JobActionResult(
            changed=tuple(job_id for job_id, _state, done, _path in rows if done),
            refused=Counter(state for _job_id, state, done, _path in rows if not done),
            gone=tuple(sorted(set(requested) - {row[0] for row in rows})),
            changed_rows=tuple((job_id, state, path) for job_id, state, done, path in rows if done),
            batches=1,
            requested=tuple(job_id for job_id, state, done, _path in rows if done and state == "running"),
        )
        if on_batch is not None and result.changed:
            on_batch(result)
    return result, (rows[-1][0] if rows else 0)


def act_on_matching(
    queryset,
    action: str,
    *,
    batch_size: int | None = None,
    on_batch: OnBatch | None = None,
    by: str = "admin",
    running: bool = False,
) -> JobActionResult:
    """``action`` (retry, cancel, purge) on every job ``queryset`` matches that is in a state
    the action applies to, ``batch_size`` jobs per statement and transaction, in id order.

    Each batch selects the next ids past the last one locked (keyset, so no batch re-reads
    what an earlier one changed), and the loop ends on a batch that finds none: a batch cut
    short by a job deleted meanwhile does not end it early."""
    batch_size = BATCH_SIZE if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    allowed = _allowed(action, running)
    total = JobActionResult()
    last = 0
    while True:
        batch = queryset.filter(state__in=allowed, id__gt=last).order_by("id").values("id")[:batch_size]
        try:
            selection = batch.query.sql_with_params()
        except EmptyResultSet:  # the filters can match no job at all
            return total
        result, last = _run(batch.db, action, selection, on_batch=on_batch, by=by, running=running)
        if not last:
            return total
        total += result


def act_on_ids(
    ids, action: str, *, on_batch: OnBatch | None = None, by: str = "admin", running: bool = False, using: str | None = None
) -> JobActionResult:
    """``action`` on jobs by id (what an operator ticked): one statement; the result names the
    ids that no longer exist, and the state of each one it refused."""
    ids = list(ids)
    jobs = Job.objects.using(using) if using else Job.objects
    using, selection = _selection(jobs.filter(id__in=ids))
    if selection is None:
        return JobActionResult()
    return _run(using, action, selection, requested=ids, on_batch=on_batch, by=by, running=running)[0]


def retry_jobs(queryset, **options) -> JobActionResult:
    """Make failed and quarantined jobs of ``queryset`` ready now, with one more attempt."""
    return act_on_matching(queryset, "retry", **options)


def cancel_jobs(queryset, **options) -> JobActionResult:
    """Cancel the ready (due or scheduled) jobs of ``queryset`` at once; with ``running=True``,
    ask the workers of its running ones to stop them (they end cancelled); ``by`` names who."""
    return act_on_matching(queryset, "cancel", **options)


def retry_job_ids(ids, **options) -> JobActionResult:
    """retry_jobs() on jobs by id; the result names the ids that no longer exist."""
    return act_on_ids(ids, "retry", **options)


def cancel_job_ids(ids, **options) -> JobActionResult:
    """cancel_jobs() on jobs by id; the result names the ids that no longer exist."""
    return act_on_ids(ids, "cancel", **options)


# --- queues -------------------------------------------------------------------------------------


def _upsert_queues(names, using: str | None, **values) -> int:
    with connections[using or router.db_for_write(Queue)].cursor() as cursor:
        return operator.upsert_queues(cursor, names, **values)


# ``using``: the database of the queues' rows, where their jobs live (None: the Queue model's).
def pause_queues(names, *, using: str | None = None) -> int:
    """Pause queues by name: workers stop claiming from them; running jobs finish."""
    return _upsert_queues(names, using, paused=True)


def resume_queues(names, *, using: str | None = None) -> int:
    """Resume paused queues by name."""
    return _upsert_queues(names, using, paused=False)


def limit_queues(names, limit: int | None, *, using: str | None = None) -> int:
    """Set the cluster-wide concurrency limit of queues by name (None: unlimited)."""
    return _upsert_queues(names, using, concurrency_limit=validate_concurrency_limit(limit))


# --- schedules ----------------------------------------------------------------------------------


def set_schedules_enabled(queryset, enabled: bool) -> int:
    """Enable or disable schedules. ``next_run`` goes back to NULL either way, as when a worker
    re-syncs them: a re-enabled schedule starts at its next slot and never catches up."""
    using, selection = _selection(queryset)
    if selection is None:
        return 0
    with connections[using].cursor() as cursor:
        return operator.set_schedules_enabled(cursor, selection, enabled)

"""The operator's statements: what the admin reads and writes, what ``manage.py backwave_queue``
and a worker's start-up write, one statement of ``queries.sql`` each.

Every function takes a DB-API cursor of the caller's connection (Django's, in practice), so an
action joins the request's transaction and counts as one of its queries, and this module needs
no Django itself. The caller picks the database; the admin turns a queryset into the
``selection`` (SQL of ids, and its positional parameters) the job and schedule actions lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..queue_rules import validate_concurrency_limit, validate_queue_name
from .contract import NOTHING_OBSERVED
from .enqueue import restore_enable_seqscan
from .queries import QUERIES

# A column the caller leaves out of upsert_queues keeps what its row holds.
UNSET: Any = object()

# A job action's name -> the SET list of queries.sql that act_on_jobs applies.
JOB_ACTIONS = {"retry": "retry_job_assignments", "cancel": "cancel_job_assignments"}
# ... and the CTEs that carry the change to the changed jobs' dependents (workflows).
JOB_ACTION_DEPENDENTS = {"retry": "retry_job_dependents", "cancel": "cancel_job_dependents"}


# The transition a job action notes for observers (backwave/observers.py); a retry notes none.
JOB_ACTION_TRANSITIONS = {"cancel": "cancelled"}


def act_on_jobs(
    cursor, action: str, selection: tuple[str, Sequence], allowed: Sequence[str], *, observed: str = NOTHING_OBSERVED
) -> list[tuple[int, str, bool, str]]:
    """Run ``action`` (retry, cancel or purge) on the selected jobs that are in an ``allowed``
    state: (id, state when locked, changed, task path) per selected job that still exists, by id.
    A cancel settles the changed jobs' dependents as a failed ancestor would, and notes a
    'cancelled' transition for each job it changed that ``observed`` watches, in the same
    statement; a retry re-arms the dependents held for them."""
    if action not in JOB_ACTIONS and action != "purge":
        raise ValueError(f"unknown job action {action!r}; use one of {', '.join([*JOB_ACTIONS, 'purge'])}")
    sql, params = selection
    if action == "purge":
        cursor.execute(QUERIES["purge_selected_jobs"].format(selection=sql), [*params, list(allowed)])
        rows = cursor.fetchall()
        restore_enable_seqscan(cursor, rows[0][-1])  # a purge returns one row at least
        return [row[:-1] for row in rows if row[0] is not None]
    statement = QUERIES["act_on_jobs"].format(
        selection=sql, assignments=QUERIES[JOB_ACTIONS[action]], then=QUERIES[JOB_ACTION_DEPENDENTS[action]]
    )
    cursor.execute(statement, [*params, list(allowed), JOB_ACTION_TRANSITIONS.get(action), observed])
    return cursor.fetchall()


MAX_CANCELLED_BY = 255  # Job.cancel_requested_by


def cancel_jobs(
    cursor, selection: tuple[str, Sequence], *, by: str, allowed: Sequence[str], observed: str = NOTHING_OBSERVED
) -> list[tuple[int, str, bool]]:
    """Cancel the selected jobs in an ``allowed`` state: a ready one at once, a running one by a
    request its worker is told of (see cancel_jobs in queries.sql). ``by`` names who cancels
    (cut to what the column holds); a job cancelled at once gets the transition ``observed`` watches.
    Rows as act_on_jobs returns them: (id, state when locked, changed)."""
    by = str(by)[:MAX_CANCELLED_BY]
    sql, params = selection
    cursor.execute(QUERIES["cancel_jobs"].format(selection=sql), [*params, by, list(allowed), observed, by])
    return cursor.fetchall()


def jobs_page_details(cursor, job_ids: Sequence[int], *, tail: int) -> dict[int, tuple]:
    """job id -> (latest attempt's error class, last ``tail`` characters of its traceback, its
    duration in seconds, seconds running so far when running, whether its pump has a row)."""
    cursor.execute(QUERIES["admin_jobs_page_details"], {"ids": list(job_ids), "tail": tail})
    return {row[0]: row[1:] for row in cursor.fetchall()}


def set_schedules_enabled(cursor, selection: tuple[str, Sequence], enabled: bool) -> int:
    """Enable or disable the selected schedules (next_run back to NULL); how many changed."""
    sql, params = selection
    cursor.execute(QUERIES["set_schedules_enabled"].format(selection=sql), [*params, enabled, enabled])
    return cursor.rowcount


def upsert_queues(cursor, names: Iterable[str], *, paused: bool = UNSET, concurrency_limit: int | None = UNSET) -> int:
    """Write the columns given into the Queue rows of ``names``, creating missing rows (one
    statement); ValueError, before anything is written, for a name or limit out of the rules."""
    names = sorted({validate_queue_name(name) for name in names})
    if concurrency_limit is not UNSET:
        validate_concurrency_limit(concurrency_limit)
    if not names:
        return 0
    cursor.execute(
        QUERIES["upsert_queues"],
        {
            "names": names,
            "set_paused": paused is not UNSET,
            "paused": None if paused is UNSET else paused,
            "set_limit": concurrency_limit is not UNSET,
            "concurrency_limit": None if concurrency_limit is UNSET else concurrency_limit,
        },
    )
    return len(names)


def set_queue_admission(
    cursor,
    name: str,
    *,
    key_concurrency_limit: int | None,
    rate_limit: int | None,
    key_rate_limit: int | None,
    rate_period: float | None,
) -> None:
    """Write a queue's admission limits (BACKWAVE["QUEUES"], validated by conf), creating its row."""
    cursor.execute(
        QUERIES["set_queue_admission"],
        {
            "name": validate_queue_name(name),
            "key_concurrency_limit": key_concurrency_limit,
            "rate_limit": rate_limit,
            "key_rate_limit": key_rate_limit,
            "rate_period": rate_period,
        },
    )


def queue_has_admission(cursor, name: str) -> bool:
    """Whether the queue's row carries a per-key concurrency or rate limit."""
    cursor.execute(QUERIES["queue_has_admission"], {"name": name})
    return cursor.fetchone()[0]


def queue_settings_upserts(settings_queues: Mapping[str, Mapping]) -> list[tuple[str, dict[str, Any]]]:
    """(queue, columns) to write for BACKWAVE["QUEUES"] (validated by conf): only the keys a
    queue's entry names, so the rest keep what the admin set; queues naming none are left out."""
    upserts = []
    for name, spec in settings_queues.items():
        if values := {key: spec[key] for key in ("concurrency_limit", "paused") if key in spec}:
            upserts.append((name, values))
    return upserts


def table_statistics(cursor) -> list[tuple]:
    """Rows of (reltuples, attname, null_frac, n_distinct, most common values, their
    frequencies, Queue row names): the planner's statistics of backwave_job."""
    cursor.execute(QUERIES["admin_table_statistics"])
    return cursor.fetchall()


def queue_overview(cursor, *, names: Sequence[str], limit: int) -> list[tuple]:
    """(name, has a row, concurrency_limit, paused, due, scheduled, running, failed,
    quarantined) per known queue and per one of ``names``; depths counted up to ``limit``."""
    cursor.execute(QUERIES["admin_queue_overview"], {"names": list(names), "limit": limit})
    return cursor.fetchall()


def throughput(cursor, *, minutes: int, limit: int) -> list[tuple]:
    """(queue, minutes ago, outcomes, minutes covered or None) over the last ``minutes``, each
    finished state read up to ``limit`` rows."""
    cursor.execute(QUERIES["admin_throughput"], {"minutes": minutes, "limit": limit})
    return cursor.fetchall()


def pumps_in_flight(cursor, worker_ids: Sequence[str]) -> dict[str, int]:
    """How many jobs run right now under each of these pumps' leases (pumps running none are
    left out), one aggregate statement however many pumps."""
    cursor.execute(QUERIES["admin_pumps_in_flight"], {"worker_ids": list(worker_ids)})
    return dict(cursor.fetchall())


def ancestor_outputs(cursor, job_id: int) -> list[tuple]:
    """(id, task_path, state, output) of each ancestor of the job, in its after= order: a
    JobContext's resolver, one statement however many ancestors."""
    cursor.execute(QUERIES["ancestor_outputs"], {"job_id": job_id})
    return cursor.fetchall()


def job_links(cursor, job_id: int, *, limit: int) -> list[tuple]:
    """(side, id, task_path, state, on_failure, total on that side) of up to ``limit`` ancestors
    and dependents of the job: the admin's job page, one statement."""
    cursor.execute(QUERIES["admin_job_links"], {"job_id": job_id, "limit": limit})
    return cursor.fetchall()


def available_connections(cursor) -> int:
    """How many connections the server accepts from ordinary roles."""
    cursor.execute(QUERIES["available_connections"])
    return cursor.fetchone()[0]


def rollup_status(cursor, *, limit: int) -> tuple:
    """(watermark, last rollup run or None, its age as an interval or None, attempts past the
    watermark counted up to ``limit``, the database's time)."""
    cursor.execute(QUERIES["admin_rollup_status"], {"limit": limit})
    return cursor.fetchone()


def stats_series(cursor, *, seconds: int, resolution: int, tail: int) -> list[tuple]:
    """(bucket start, succeeded, failing) per bucket of ``resolution`` over the last ``seconds``:
    the rollup's buckets plus up to ``tail`` attempts it has not reached yet."""
    cursor.execute(QUERIES["admin_stats_series"], {"seconds": seconds, "resolution": resolution, "tail": tail})
    return cursor.fetchall()


def task_stats(cursor, *, seconds: int, resolution: int, tasks: Sequence[str] | None = None) -> list[tuple]:
    """Per task over the last ``seconds`` (buckets of ``resolution``): (task, succeeded, retried,
    failed, quarantined, lapsed, cancelled, snoozed, reruns, timed, duration sum, duration max,
    [histograms])."""
    cursor.execute(
        QUERIES["admin_task_stats"],
        {"seconds": seconds, "resolution": resolution, "tasks": None if tasks is None else list(tasks)},
    )
    return cursor.fetchall()


def recent_failures(cursor, *, limit: int) -> list[tuple]:
    """The last ``limit`` attempts that did not succeed, newest first."""
    cursor.execute(QUERIES["admin_recent_failures"], {"limit": limit})
    return cursor.fetchall()


def running_jobs(cursor, *, limit: int) -> list[tuple]:
    """Running jobs, longest-running first: (id, task, queue, worker, attempt, started, seconds
    running, lease expiry, lease lapsed)."""
    cursor.execute(QUERIES["admin_running_jobs"], {"limit": limit})
    return cursor.fetchall()


def queue_latency(cursor, names: Sequence[str]) -> dict[str, float]:
    """Seconds the oldest due ready job of each queue has waited (queues with none left out)."""
    cursor.execute(QUERIES["admin_queue_latency"], {"names": list(names)})
    return dict(cursor.fetchall())


def unserved_queues(cursor) -> list[tuple[str, float]]:
    """(queue, seconds its oldest due job waited) per queue with a due ready job that no live
    pump serves, by name (the store contract's unserved_queues, on the caller's connection)."""
    cursor.execute(QUERIES["unserved_queues"])
    return [(queue, float(seconds)) for queue, seconds in cursor.fetchall()]


def hint_sessions(cursor) -> tuple:
    """(sessions named backwave-hints on this database, the oldest's start, the newest's)."""
    cursor.execute(QUERIES["admin_hint_sessions"])
    return cursor.fetchone()


def metrics_without_jit(cursor) -> None:
    """No JIT compilation for the rest of the caller's transaction (see queries.sql)."""
    cursor.execute(QUERIES["metrics_without_jit"])


def metrics_queues(cursor, *, names: Sequence[str], limit: int) -> list[tuple]:
    """(name, paused, due, scheduled, running, failed, quarantined, seconds the oldest due job
    has waited or None) per known queue and per one of ``names``; depths counted up to ``limit``."""
    cursor.execute(QUERIES["metrics_queues"], {"names": list(names), "limit": limit})
    return cursor.fetchall()


def lapsed_leases(cursor) -> tuple[int, int]:
    """(leases past their expiry not yet released, jobs still running under them)."""
    cursor.execute(QUERIES["metrics_lapsed_leases"])
    return tuple(cursor.fetchone())

"""Helpers for the store contract tests: one view of the tables, whichever store is under test.

The contract tests run against every store implementation (see ``conftest.py``). They set rows
up and read them back through a ``Rows`` object, so a test reads the same for PostgreSQL (the
ORM on Django's connection, the database clock) and for the in-memory store (its tables, its
injected clock).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from threading import Lock

import psycopg
from django.db import connection
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

from backwave.models import Attempt, Job, KeyRateWindow, Lease, Overrun, Pump, Queue, Schedule, TaskStat, Transition
from backwave.testing.memory_store import AttemptRow, MemoryDatabase, QueueAdmission
from backwave.store.queries import QUERIES
from backwave.taskstats import TaskSummary
from tests.factories import JobFactory


@dataclass(frozen=True)
class LeaseRef:
    id: uuid.UUID
    worker_id: str


def ago(seconds: float) -> datetime:
    """A timestamp ``seconds`` in the past, for ordering fixtures only (run_at of test rows)."""
    return timezone.now() - timedelta(seconds=seconds)


def in_effect(store) -> dict[str, tuple[str, str]]:
    """(value inside the store's own transaction, the session's own value) of the settings
    BackWave sets, read by a statement that goes through the store's round-trip like any other."""
    QUERIES["probe_settings"] = (
        "SELECT name, setting, reset_val FROM pg_settings WHERE name IN ('synchronous_commit', 'statement_timeout', 'lock_timeout')"
    )
    try:
        return {name: (setting, reset) for name, setting, reset in store._execute("probe_settings", {})}
    finally:
        del QUERIES["probe_settings"]


def server_default(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reset_val FROM pg_settings WHERE name = %s", [name])
        return cursor.fetchone()[0]


class PostgresRows:
    """The tables through the ORM, the clock through ``statement_timestamp()``: the same as
    ``now()`` in autocommit, and still moving inside a test's transaction (the django kind)."""

    def now(self) -> datetime:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]

    def set_queue(self, name: str, *, concurrency_limit: int | None = None, paused: bool = False) -> None:
        Queue.objects.update_or_create(name=name, defaults={"concurrency_limit": concurrency_limit, "paused": paused})

    def set_admission(
        self, name: str, *, key_concurrency_limit=None, rate_limit=None, rate_period=None, key_rate_limit=None
    ) -> None:
        Queue.objects.update_or_create(
            name=name,
            defaults={
                "key_concurrency_limit": key_concurrency_limit,
                "rate_limit": rate_limit,
                "rate_period": rate_period,
                "key_rate_limit": key_rate_limit,
            },
        )

    def key_rate_windows(self, name: str) -> dict:
        return {w.limit_key: w.used for w in KeyRateWindow.objects.filter(queue=name)}

    def age_key_rate_windows(self, name: str) -> None:
        """Move every key window of the queue one period into the past."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE backwave_key_rate_window AS w SET window_start = w.window_start - make_interval(secs => q.rate_period)"
                " FROM backwave_queue AS q WHERE q.name = w.queue AND w.queue = %s",
                [name],
            )

    def rate_window(self, name: str) -> tuple:
        queue = Queue.objects.get(name=name)
        return queue.rate_window_start, queue.rate_window_used

    def age_rate_window(self, name: str) -> None:
        """Move the queue's rate window one period into the past, as if that period had passed."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE backwave_queue SET rate_window_start = rate_window_start - make_interval(secs => rate_period) WHERE name = %s",
                [name],
            )

    def make_jobs(self, count: int, **fields) -> list[Job]:
        """Insert ``count`` ready jobs with one statement; returns them in id order."""
        jobs = Job.objects.bulk_create(JobFactory.build_batch(count, **fields))
        return sorted(jobs, key=lambda job: job.pk)

    def job(self, pk: int) -> Job:
        return Job.objects.get(pk=pk)

    def jobs(self) -> dict[int, Job]:
        return {job.pk: job for job in Job.objects.all()}

    def states(self, ids) -> dict[int, str]:
        return dict(Job.objects.filter(pk__in=list(ids)).values_list("pk", "state"))

    def count(self, state: str | None = None) -> int:
        return (Job.objects.filter(state=state) if state else Job.objects).count()

    def set_state(self, pk: int, state: str) -> None:
        """An operator's change of state that leaves every other column (the lease token too) alone."""
        Job.objects.filter(pk=pk).update(state=state)

    def request_cancel(self, pk: int, by: str) -> None:
        Job.objects.filter(pk=pk).update(cancel_requested_at=self.now(), cancel_requested_by=by)

    def lease(self, lease_id: uuid.UUID) -> Lease | None:
        return Lease.objects.filter(pk=lease_id).first()

    def lease_ids(self) -> list[uuid.UUID]:
        return list(Lease.objects.values_list("pk", flat=True))

    @contextmanager
    def hold(self, *pks: int) -> Iterator[None]:
        """An application's transaction holding these job rows (select_for_update()) until the
        block ends, on a session of its own, rolled back then."""
        params = {**connection.get_connection_params(), "autocommit": False}
        params.pop("cursor_factory", None)
        with psycopg.connect(**params) as session:
            session.execute("SELECT id FROM backwave_job WHERE id = ANY(%s) ORDER BY id FOR UPDATE", [list(pks)])
            yield
            session.rollback()

    def lapse(self, lease_id: uuid.UUID, *, seconds_ago: float = 1.0) -> None:
        """Move a lease's expiry into the past by the database clock."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE backwave_lease SET expires_at = statement_timestamp() - make_interval(secs => %s) WHERE id = %s",
                [seconds_ago, lease_id],
            )

    def delete_lease(self, lease_id: uuid.UUID) -> None:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM backwave_lease WHERE id = %s", [lease_id])

    def overruns(self) -> list[tuple[int, int, uuid.UUID]]:
        """(job id, attempt, lease id) of every overrun row, in job and attempt order."""
        return list(Overrun.objects.order_by("job_id", "attempt").values_list("job_id", "attempt", "lease_id"))

    def attempts(self) -> list[Attempt]:
        return list(Attempt.objects.all())

    def transitions(self) -> list[Transition]:
        return list(Transition.objects.order_by("id"))

    def deliverers(self) -> dict[str, list[str]]:
        """Each observer loop's id and the observers it registered, as its last claim recorded."""
        from backwave.models import Deliverer

        return {d.id: list(d.observers) for d in Deliverer.objects.all()}

    def lapse_transition_claims(self) -> None:
        """Every claimed transition's claim lapsed a second ago (its claimer died)."""
        with connection.cursor() as cursor:
            cursor.execute("UPDATE backwave_transition SET next_attempt_at = statement_timestamp() - interval '1 second'")

    def add_attempt(self, *, job_id: int, number: int, state: str, worker_id: str) -> None:
        Attempt.objects.create(job_id=job_id, number=number, state=state, worker_id=worker_id)

    def sql_null_return_values(self) -> tuple[list, list]:
        """(job id, value is SQL NULL, value is JSON null) per job; (job id, SQL NULL) per attempt."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, return_value IS NULL, return_value = 'null'::jsonb FROM backwave_job ORDER BY id")
            jobs = cursor.fetchall()
            cursor.execute("SELECT job_id, return_value IS NULL FROM backwave_attempt ORDER BY job_id")
            return jobs, cursor.fetchall()

    # -- maintenance tables ---------------------------------------------------------------------

    def schedules(self) -> dict[str, Schedule]:
        return {row.name: row for row in Schedule.objects.all()}

    def set_schedule(self, name: str, **fields) -> None:
        Schedule.objects.filter(name=name).update(**fields)

    def make_due(self, name: str, *, seconds_ago: float) -> None:
        """The schedule's next run came that long ago (by the database clock)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE backwave_schedule SET next_run = statement_timestamp() - make_interval(secs => %s) WHERE name = %s",
                [seconds_ago, name],
            )

    def finished_job(self, state: str, *, seconds_ago: float | None, attempts: int = 0) -> int:
        """A job in ``state`` that finished that long ago, with that many attempt rows."""
        job = self.make_jobs(1, state=state, attempts=attempts)[0]
        if seconds_ago is not None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE backwave_job SET finished_at = statement_timestamp() - make_interval(secs => %s) WHERE id = %s",
                    [seconds_ago, job.pk],
                )
        for number in range(1, attempts + 1):
            self.add_attempt(job_id=job.pk, number=number, state="failed", worker_id="w")
        return job.pk

    def pumps(self) -> dict[str, Pump]:
        return {row.worker_id: row for row in Pump.objects.all()}

    def task_stats(self, resolution: int) -> dict[str, dict]:
        """The rollup's buckets of one resolution summed per task (a test may straddle a minute)."""
        return summed_stats((row.task_path, row) for row in TaskStat.objects.filter(resolution=resolution).order_by("bucket"))

    def stat_buckets(self) -> list[tuple[int, datetime, str]]:
        return sorted(TaskStat.objects.values_list("resolution", "bucket", "task_path"))

    def age_stat_buckets(self, *, resolution: int, seconds: float) -> None:
        """Move every bucket of one resolution ``seconds`` into the past."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE backwave_task_stat SET bucket = bucket - make_interval(secs => %s) WHERE resolution = %s",
                [seconds, resolution],
            )

    def silence_pump(self, worker_id: str, *, seconds: float) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE backwave_pump SET last_heartbeat_at = statement_timestamp() - make_interval(secs => %s) WHERE worker_id = %s",
                [seconds, worker_id],
            )


STAT_FIELDS = (
    "succeeded",
    "retried",
    "failed",
    "quarantined",
    "lapsed",
    "cancelled",
    "snoozed",
    "reruns",
    "timed",
    "duration_sum",
    "duration_max",
)


def summed_stats(rows) -> dict[str, dict]:
    """{task: numbers} summed over (task, bucket row) pairs, durations rounded to the microsecond
    the database keeps, the histogram as {int bin: count}."""
    summaries: dict[str, TaskSummary] = {}
    for task, row in rows:
        histogram = getattr(row, "duration_histogram", None)
        if histogram is None:
            histogram = row.histogram
        summaries.setdefault(task, TaskSummary(task_path=task)).add(
            **{name: getattr(row, name) for name in STAT_FIELDS}, histogram=histogram
        )
    return {
        task: {**{name: round(getattr(s, name), 6) for name in STAT_FIELDS}, "bins": s.histogram} for task, s in summaries.items()
    }


class TickingClock:
    """A virtual database clock for the in-memory store: starts at the host's time and moves one
    millisecond per reading, so consecutive operations see increasing times, as they do on a server."""

    def __init__(self, start: datetime | None = None, step: timedelta = timedelta(milliseconds=1)):
        self._now = start or datetime.now(UTC)
        self._step = step
        self._lock = Lock()

    def __call__(self) -> datetime:
        with self._lock:
            self._now += self._step
            return self._now


class MemoryRows:
    """The in-memory store's tables, read directly, and its injected clock."""

    def __init__(self, database: MemoryDatabase):
        self.database = database

    def now(self) -> datetime:
        return self.database.now()

    def set_queue(self, name: str, *, concurrency_limit: int | None = None, paused: bool = False) -> None:
        with self.database.lock:
            self.database.queues[name] = (concurrency_limit, paused)

    def set_admission(
        self, name: str, *, key_concurrency_limit=None, rate_limit=None, rate_period=None, key_rate_limit=None
    ) -> None:
        self.database.admission[name] = QueueAdmission(key_concurrency_limit, rate_limit, rate_period, key_rate_limit)

    def key_rate_windows(self, name: str) -> dict:
        return {key: used for (queue, key), (_, used) in self.database.key_rate_windows.items() if queue == name}

    def age_key_rate_windows(self, name: str) -> None:
        period = timedelta(seconds=self.database.admission[name].rate_period)
        for slot, (start, used) in list(self.database.key_rate_windows.items()):
            if slot[0] == name:
                self.database.key_rate_windows[slot] = (start - period, used)

    def rate_window(self, name: str) -> tuple:
        return self.database.rate_windows.get(name, (None, 0))

    def age_rate_window(self, name: str) -> None:
        start, used = self.database.rate_windows[name]
        self.database.rate_windows[name] = (start - timedelta(seconds=self.database.admission[name].rate_period), used)

    def make_jobs(self, count: int, **fields):
        built = JobFactory.build_batch(count, **fields)
        rows = []
        for job in built:
            values = {name: getattr(job, name) for name in _JOB_COLUMNS}
            values = {
                name: value for name, value in values.items() if not isinstance(value, DatabaseDefault) and value is not None
            }
            rows.append(self.database.insert_job(**values))
        return rows

    def job(self, pk: int):
        return self.database.jobs[pk]

    def jobs(self) -> dict:
        return dict(self.database.jobs)

    def states(self, ids) -> dict[int, str]:
        return {pk: self.database.jobs[pk].state for pk in ids if pk in self.database.jobs}

    def count(self, state: str | None = None) -> int:
        return sum(1 for job in self.database.jobs.values() if state is None or job.state == state)

    def set_state(self, pk: int, state: str) -> None:
        self.database.jobs[pk].state = state

    def request_cancel(self, pk: int, by: str) -> None:
        job = self.database.jobs[pk]
        job.cancel_requested_at, job.cancel_requested_by = self.now(), by

    def lease(self, lease_id: uuid.UUID):
        return self.database.leases.get(lease_id)

    def lease_ids(self) -> list[uuid.UUID]:
        return list(self.database.leases)

    @contextmanager
    def hold(self, *pks: int) -> Iterator[None]:
        """An application's transaction holding these job rows until the block ends."""
        self.database.held_rows.update(pks)
        try:
            yield
        finally:
            self.database.held_rows.difference_update(pks)

    def lapse(self, lease_id: uuid.UUID, *, seconds_ago: float = 1.0) -> None:
        self.database.leases[lease_id].expires_at = self.now() - timedelta(seconds=seconds_ago)

    def delete_lease(self, lease_id: uuid.UUID) -> None:
        self.database.forget_leases([lease_id])

    def overruns(self) -> list[tuple[int, int, uuid.UUID]]:
        return [(job_id, attempt, row.lease_id) for (job_id, attempt), row in sorted(self.database.overruns.items())]

    def attempts(self) -> list:
        return self.database.attempt_log()

    def transitions(self) -> list:
        return [self.database.transitions[key] for key in sorted(self.database.transitions)]

    def deliverers(self) -> dict[str, list[str]]:
        return {key: list(row.observers) for key, row in self.database.deliverers.items()}

    def lapse_transition_claims(self) -> None:
        for row in self.database.transitions.values():
            row.next_attempt_at = self.now() - timedelta(seconds=1)

    def add_attempt(self, *, job_id: int, number: int, state: str, worker_id: str) -> None:
        self.database.attempts[(job_id, number)] = AttemptRow(
            id=self.database.next_attempt_id(),
            job_id=job_id,
            number=number,
            state=state,
            worker_id=worker_id,
            started_at=None,
            finished_at=self.now(),
        )

    def sql_null_return_values(self) -> tuple[list, list]:
        jobs = [
            (pk, job.return_value_json is None, None if job.return_value_json is None else job.return_value_json == "null")
            for pk, job in sorted(self.database.jobs.items())
        ]
        return jobs, [(a.job_id, a.return_value_json is None) for a in self.database.attempt_log()]

    # -- maintenance tables ---------------------------------------------------------------------

    def schedules(self) -> dict:
        return {row.name: row for row in self.database.schedules.values()}

    def set_schedule(self, name: str, **fields) -> None:
        row = self.schedules()[name]
        for field, value in fields.items():
            setattr(row, field, value)

    def make_due(self, name: str, *, seconds_ago: float) -> None:
        self.schedules()[name].next_run = self.now() - timedelta(seconds=seconds_ago)

    def finished_job(self, state: str, *, seconds_ago: float | None, attempts: int = 0) -> int:
        job = self.make_jobs(1, state=state, attempts=attempts)[0]
        if seconds_ago is not None:
            job.finished_at = self.now() - timedelta(seconds=seconds_ago)
        for number in range(1, attempts + 1):
            self.add_attempt(job_id=job.pk, number=number, state="failed", worker_id="w")
        return job.pk

    def pumps(self) -> dict:
        return dict(self.database.pumps)

    def task_stats(self, resolution: int) -> dict[str, dict]:
        buckets = sorted(self.database.task_stats.items(), key=lambda item: item[0][1])
        return summed_stats((task, summary) for (width, _bucket, task), summary in buckets if width == resolution)

    def stat_buckets(self) -> list[tuple[int, datetime, str]]:
        return sorted(self.database.task_stats)

    def age_stat_buckets(self, *, resolution: int, seconds: float) -> None:
        stats = self.database.task_stats
        for key in [key for key in stats if key[0] == resolution]:
            stats[(resolution, key[1] - timedelta(seconds=seconds), key[2])] = stats.pop(key)

    def silence_pump(self, worker_id: str, *, seconds: float) -> None:
        self.database.pumps[worker_id].last_heartbeat_at = self.now() - timedelta(seconds=seconds)


_JOB_COLUMNS = (
    "task_path",
    "queue",
    "priority",
    "payload",
    "state",
    "backend",
    "tags",
    "run_at",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "finished_at",
    "attempts",
    "max_attempts",
    "backoff_base",
    "backoff_max",
    "lease_id",
    "worker_id",
    "forgiven_attempts",
    "suspect",
    "timeout",
)

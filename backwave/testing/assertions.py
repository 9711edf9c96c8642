"""Assertions about enqueued jobs, in the spirit of Oban.Testing.

They read the job table on Django's connection, so they see what your code enqueued inside the
test's transaction. A job matches when every filter given matches: the task (a Task or its
import path), ``args`` (the whole list), ``kwargs`` (each key given has that value; other keys
may be present), ``queue``, ``priority``, ``tags`` (each tag given is present) and ``state``
(``"ready"`` by default: enqueued and not yet run; ``None`` for any state).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.tasks import Task

_ANY: Any = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuedJob:
    """A job row, as the assertions show it."""

    id: int
    task_path: str
    args: list
    kwargs: dict
    queue: str
    priority: int
    state: str
    run_at: datetime
    attempts: int
    max_attempts: int
    tags: tuple[str, ...]
    backend: str

    def __str__(self) -> str:
        return (
            f"#{self.id} {self.task_path}(args={self.args!r}, kwargs={self.kwargs!r}) queue={self.queue!r} "
            f"priority={self.priority} state={self.state} attempts={self.attempts}/{self.max_attempts}"
        )


def all_enqueued(
    task: Task | str | None = None,
    *,
    args: Sequence[Any] = _ANY,
    kwargs: dict[str, Any] = _ANY,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] = (),
    state: str | None = "ready",
    database: str = "default",
) -> list[EnqueuedJob]:
    """Every job matching the filters, oldest first."""
    rows = _query(task, queue=queue, priority=priority, state=state, database=database)
    wanted_tags = set(tags)
    return [
        job
        for job in rows
        if (args is _ANY or job.args == list(args))
        and (kwargs is _ANY or all(key in job.kwargs and job.kwargs[key] == value for key, value in kwargs.items()))
        and wanted_tags <= set(job.tags)
    ]


def assert_enqueued(task: Task | str | None = None, **filters: Any) -> EnqueuedJob:
    """Fail unless a job matching the filters is enqueued; returns the first one."""
    found = all_enqueued(task, **filters)
    if not found:
        raise AssertionError(f"Expected {_describe(task, filters)} to be enqueued.\n{_nearby(task, filters)}")
    return found[0]


def refute_enqueued(task: Task | str | None = None, **filters: Any) -> None:
    """Fail if any job matching the filters is enqueued."""
    found = all_enqueued(task, **filters)
    if found:
        listed = "\n".join(f"  {job}" for job in found)
        raise AssertionError(f"Expected no {_describe(task, filters)} to be enqueued, found {len(found)}:\n{listed}")


class capture_enqueued:  # noqa: N801 - used like a function: with capture_enqueued() as jobs
    """Collect the jobs enqueued inside a ``with`` block, in the order they were enqueued::

        with capture_enqueued() as jobs:
            signup(email="a@example.com")
        assert [job.task_path for job in jobs] == ["accounts.tasks.send_welcome"]

    The list fills when the block ends (jobs of every state: a job already run still counts).
    """

    def __init__(self, *, database: str = "default") -> None:
        self.database = database
        self.jobs: list[EnqueuedJob] = []
        self._mark = 0

    def __enter__(self) -> list[EnqueuedJob]:
        from django.db.models import Max

        from backwave.models import Job

        self._mark = Job.objects.using(self.database).aggregate(mark=Max("pk"))["mark"] or 0
        return self.jobs

    def __exit__(self, *exc_info: object) -> None:
        from backwave.models import Job

        rows = Job.objects.using(self.database).filter(pk__gt=self._mark).order_by("pk")
        self.jobs.extend(_enqueued(row) for row in rows)


class JobAssertions:
    """The assertions bound to one database alias (the ``backwave_jobs`` fixture)."""

    def __init__(self, database: str = "default") -> None:
        self.database = database

    def all(self, task: Task | str | None = None, **filters: Any) -> list[EnqueuedJob]:
        """See all_enqueued()."""
        return all_enqueued(task, database=self.database, **filters)

    def assert_enqueued(self, task: Task | str | None = None, **filters: Any) -> EnqueuedJob:
        """See assert_enqueued()."""
        return assert_enqueued(task, database=self.database, **filters)

    def refute_enqueued(self, task: Task | str | None = None, **filters: Any) -> None:
        """See refute_enqueued()."""
        refute_enqueued(task, database=self.database, **filters)

    def capture(self) -> capture_enqueued:
        """See capture_enqueued()."""
        return capture_enqueued(database=self.database)


def _task_path(task: Task | str | None) -> str | None:
    if task is None or isinstance(task, str):
        return task
    if isinstance(task, Task):
        return task.module_path
    raise TypeError(f"pass a Task (a function decorated with @task) or its import path, not {task!r}")


def _query(task, *, queue, priority, state, database) -> list[EnqueuedJob]:
    from backwave.models import Job

    rows = Job.objects.using(database).order_by("pk")
    path = _task_path(task)
    if path is not None:
        rows = rows.filter(task_path=path)
    if queue is not None:
        rows = rows.filter(queue=queue)
    if priority is not None:
        rows = rows.filter(priority=priority)
    if state is not None:
        rows = rows.filter(state=state)
    return [_enqueued(row) for row in rows]


def _enqueued(row) -> EnqueuedJob:
    payload = row.payload if isinstance(row.payload, dict) else {}
    return EnqueuedJob(
        id=row.pk,
        task_path=row.task_path,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        queue=row.queue,
        priority=row.priority,
        state=row.state,
        run_at=row.run_at,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        tags=tuple(row.tags),
        backend=row.backend,
    )


def _describe(task, filters: dict[str, Any]) -> str:
    shown = {k: v for k, v in filters.items() if k != "database" and v is not _ANY}
    shown.setdefault("state", "ready")
    what = f"a job of {_task_path(task)!r}" if task is not None else "a job"
    return what + (" with " + ", ".join(f"{k}={v!r}" for k, v in shown.items()) if shown else "")


def _nearby(task, filters: dict[str, Any]) -> str:
    """The jobs of that task (any state), so a near miss shows what differed."""
    database = filters.get("database", "default")
    others = _query(task, queue=None, priority=None, state=None, database=database)[:20]
    if not others:
        return "No job of that task is in the database." if task is not None else "The job table is empty."
    return "Jobs of that task in the database:\n" + "\n".join(f"  {job}" for job in others)

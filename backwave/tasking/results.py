"""Build ``django.tasks.TaskResult`` values from BackWave's rows or from plain values.

Two builders share one mapping:

* ``task_result_from_job(job, attempts, task=None)``: the tasks backend's ``get_result`` (a Job and
  its Attempt rows).
* ``task_result_for_attempt(...)``: the worker, for ``task_started`` / ``task_finished``, from what
  a claim returned (no query, no import: the worker passes the Task from its own registry).

Import policy: only ``task_result_from_job`` with ``task=None`` (the web side) turns a row's
``task_path`` into a Task, with ``import_string`` as Django's own ``Task._reconstruct`` does, and
only accepts a ``django.tasks.Task`` instance. A path that does not import, or names something
else, gives an ``UnresolvedTask`` stand-in instead of an error: the job exists, and its status,
errors and return value stay readable after the task was renamed or removed; the stand-in refuses
to be enqueued or called. The worker never imports a path a row names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TASK_REFRESH_ATTRS, TaskError
from django.tasks.exceptions import InvalidTask
from django.utils.module_loading import import_string

from .task import BackWaveTask

logger = logging.getLogger(__name__)

# Job.state -> TaskResultStatus. Django has no "cancelled": a cancelled job did not succeed.
STATUS_BY_STATE = {
    "waiting": TaskResultStatus.READY,  # for its ancestors: not yet claimable, but queued
    "held": TaskResultStatus.READY,  # an ancestor failed; an operator decides
    "ready": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
    "quarantined": TaskResultStatus.FAILED,
}
ERROR_ATTEMPT_STATES = frozenset({"failed", "quarantined", "lapsed", "cancelled"})
CANCELLED_ERROR = "backwave.Cancelled"


# What refresh() reloads beyond Django's own TASK_REFRESH_ATTRS.
BACKWAVE_REFRESH_ATTRS = ("progress", "metadata", "state", "reason")


@dataclass(frozen=True, slots=True, kw_only=True)
class BackWaveTaskResult(TaskResult):
    """The TaskResult BackWave's ``enqueue()``, ``get_result()`` and ``refresh()`` give: Django's,
    with its statuses as they are, plus what Django lets a backend add beside them.

    * ``state``: the job's own state, which tells apart what Django's statuses fold together:
      ``"waiting"`` (for its ancestors), ``"held"`` (an ancestor failed; an operator decides) and
      ``"ready"`` are all READY; ``"failed"``, ``"cancelled"`` and ``"quarantined"`` are all FAILED.
      ``None`` on the worker's results (``task_started``/``task_finished``), which are not read
      from the row.
    * ``reason``: why BackWave cancelled or holds the job (``"Cancelled: ancestor #12 failed."``),
      else ``""``.
    * ``progress``, the handler's last ``context.set_progress()``, and ``metadata`` (Django's
      proposed metadata API), as of the worker's last heartbeat or the attempt's end.
    * ``duplicate``: this enqueue found a unique job holding its key, and the result describes
      that job as it is now (``errors`` and ``worker_ids`` are loaded by ``refresh()``). Not
      compared: a duplicate's result equals ``get_result()``'s for the same job.

    ``refresh()`` and ``arefresh()`` reload all of them in one query.
    """

    progress: Any = None
    metadata: dict = field(default_factory=dict)
    state: str | None = None
    reason: str = ""
    duplicate: bool = field(default=False, compare=False)

    def refresh(self) -> None:
        self._update_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._update_from(await self.task.get_backend().aget_result(self.id))

    def _update_from(self, refreshed) -> None:
        for name in (*TASK_REFRESH_ATTRS, *BACKWAVE_REFRESH_ATTRS):
            object.__setattr__(self, name, getattr(refreshed, name))


# The name enqueue's result had when it was a class of its own; it is the same class now, so
# that enqueue() and get_result() give equal results for the same job.
EnqueuedResult = BackWaveTaskResult
_TASK_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


class LeaseLapsed(Exception):
    """The worker running the attempt stopped renewing its lease (killed, hung or cut off)."""


class AttemptFailed(Exception):
    """An attempt failed without a recorded exception class."""


def _unresolved_task_function(*args, **kwargs):
    raise InvalidTask("This task could not be resolved from its import path, so it cannot run.")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnresolvedTask(BackWaveTask):
    """Stands in for a job's task when its ``task_path`` no longer names a Task."""

    task_path: str = ""
    problem: str = ""

    def __post_init__(self):
        pass  # nothing to validate: it can be read, never enqueued or run

    @property
    def name(self):
        return self.task_path.rpartition(".")[2]

    @property
    def module_path(self):
        return self.task_path

    def _refuse(self):
        raise InvalidTask(f"Task {self.task_path!r} cannot be used: {self.problem}")

    def enqueue(self, *args, **kwargs):
        self._refuse()

    async def aenqueue(self, *args, **kwargs):
        self._refuse()

    def call(self, *args, **kwargs):
        self._refuse()

    async def acall(self, *args, **kwargs):
        self._refuse()


def resolve_task(job, defaults: Mapping[str, Any] | None = None) -> Task:
    """The Task a job row names, carrying the row's options; an UnresolvedTask when it cannot be
    imported. Web side only (see the module docstring).

    ``defaults``: the backend's ``DEFAULT_*`` values by option name (``max_attempts``, …). An
    option the task leaves to the default (None) stays None where the row holds that default, so
    the task of an untouched job is the task it was enqueued with. ``run_after`` is the row's
    run time when that is not the enqueue time (deferred, or a retry's), else None.
    """
    path = job.task_path
    problem = ""
    task = None
    if not _TASK_PATH_RE.match(path):
        problem = "it is not a dotted import path"
    else:
        try:
            task = import_string(path)
        except Exception as exc:  # ImportError, AttributeError, or the module failing at import
            problem = f"importing it failed ({type(exc).__name__}: {exc})"
        else:
            if not isinstance(task, Task):
                problem = f"it names a {type(task).__name__}, not a django.tasks.Task"
    if problem:
        logger.warning("Job %s: task %r is unresolved: %s", job.pk, path, problem)
        return UnresolvedTask(
            func=_unresolved_task_function,
            task_path=path,
            problem=problem,
            backend=job.backend,
            queue_name=job.queue,
            priority=job.priority,
            max_attempts=job.max_attempts,
            backoff_base=job.backoff_base,
            backoff_max=job.backoff_max,
            tags=tuple(job.tags),
            run_after=_run_after(job),
        )
    changes = {"queue_name": job.queue, "priority": job.priority, "backend": job.backend, "run_after": _run_after(job)}
    if isinstance(task, BackWaveTask):
        changes |= {"timeout": job.timeout, "tags": tuple(job.tags)}
        defaults = defaults or {}
        for name in ("max_attempts", "backoff_base", "backoff_max"):
            value = getattr(job, name)
            if not (getattr(task, name) is None and name in defaults and defaults[name] == value):
                changes[name] = value
    if all(getattr(task, name) == value for name, value in changes.items()):
        return task
    try:
        return replace(task, **changes)
    except InvalidTask:
        return task  # the row's options are no longer valid (a queue was removed): keep the task's own


def _run_after(job) -> datetime | None:
    run_at = getattr(job, "run_at", None)
    return run_at if run_at is not None and run_at != job.enqueued_at else None


def split_payload(payload) -> tuple[list, dict]:
    """``(args, kwargs)`` of a stored payload; empty for a payload of the wrong shape (quarantined)."""
    if not isinstance(payload, dict):
        return [], {}
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    return (args if isinstance(args, list) else []), (kwargs if isinstance(kwargs, dict) else {})


def task_error(*, state: str, error_class: str, traceback: str) -> TaskError:
    """A TaskError for a failed, quarantined or lapsed attempt (a class path is always present)."""
    if not error_class:
        error_class = f"{__name__}.{LeaseLapsed.__qualname__ if state == 'lapsed' else AttemptFailed.__qualname__}"
    return TaskError(exception_class_path=error_class, traceback=traceback)


def _build(
    *,
    task,
    job_id,
    status,
    args,
    kwargs,
    backend,
    enqueued_at,
    started_at,
    last_attempted_at,
    finished_at,
    errors,
    worker_ids,
    return_value,
    progress=None,
    metadata=None,
    state=None,
    reason="",
    duplicate=False,
) -> TaskResult:
    result = BackWaveTaskResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        last_attempted_at=last_attempted_at,
        finished_at=finished_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=errors,
        worker_ids=worker_ids,
        progress=progress,
        metadata=metadata if isinstance(metadata, dict) else {},
        state=state,
        reason=reason,
        duplicate=duplicate,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value)
    return result


def task_result_from_job(
    job, attempts: Iterable, task: Task | None = None, defaults: Mapping[str, Any] | None = None
) -> TaskResult:
    """The TaskResult of a Job row and its Attempt rows (in number order). ``task=None`` resolves
    the task from the row (web side only), with the backend's ``defaults`` (see resolve_task)."""
    attempts = list(attempts)
    worker_ids = [attempt.worker_id for attempt in attempts]
    if job.state == "running":
        worker_ids.append(job.worker_id)  # the attempt in progress has no row yet
    args, kwargs = split_payload(job.payload)
    return _build(
        task=task if task is not None else resolve_task(job, defaults),
        job_id=job.pk,
        status=STATUS_BY_STATE[job.state],
        args=args,
        kwargs=kwargs,
        backend=job.backend,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        last_attempted_at=job.last_attempted_at,
        finished_at=job.finished_at,
        errors=[
            task_error(state=attempt.state, error_class=attempt.error_class, traceback=attempt.traceback)
            for attempt in attempts
            if attempt.state in ERROR_ATTEMPT_STATES
        ]
        + _cancel_before_start(job, attempts),
        worker_ids=worker_ids,
        return_value=job.return_value,
        progress=getattr(job, "progress", None),
        metadata=getattr(job, "metadata", None),
        state=job.state,
        reason=getattr(job, "reason", ""),
    )


def _cancel_before_start(job, attempts: list) -> list[TaskError]:
    """A job cancelled before any attempt of it ended cancelled: the error that says why (the
    ancestor whose failure cancelled it, as its reason says) or who did."""
    if job.state != "cancelled" or any(attempt.state == "cancelled" for attempt in attempts):
        return []
    if reason := getattr(job, "reason", ""):
        because = reason.removeprefix("Cancelled: ")
        return [
            TaskError(exception_class_path=CANCELLED_ERROR, traceback=f"{CANCELLED_ERROR}: cancelled before it ran: {because}\n")
        ]
    who = getattr(job, "cancel_requested_by", "") or "an operator"
    return [TaskError(exception_class_path=CANCELLED_ERROR, traceback=f"{CANCELLED_ERROR}: cancelled by {who} before it ran.\n")]


def task_result_for_attempt(
    *,
    task: Task,
    job_id: int,
    attempt: int,
    worker_id: str,
    payload: Any,
    backend: str,
    enqueued_at: datetime | None,
    started_at: datetime | None,
    attempted_at: datetime | None,
    status: TaskResultStatus = TaskResultStatus.RUNNING,
    finished_at: datetime | None = None,
    errors: Sequence[TaskError] = (),
    earlier_worker_ids: Sequence[str] = (),
    return_value: Any = None,
) -> TaskResult:
    """The TaskResult of attempt number ``attempt`` as the worker sees it (e.g. from a ClaimedJob).

    ``worker_ids`` has one entry per attempt so that ``TaskResult.attempts`` and
    ``TaskContext.attempt`` equal ``attempt``; earlier attempts' ids not given in
    ``earlier_worker_ids`` are ``""`` (a claim does not carry them).
    """
    earlier = list(earlier_worker_ids)[: attempt - 1]
    earlier += [""] * (attempt - 1 - len(earlier))
    args, kwargs = split_payload(payload)
    return _build(
        task=task,
        job_id=job_id,
        status=status,
        args=args,
        kwargs=kwargs,
        backend=backend,
        enqueued_at=enqueued_at,
        started_at=started_at,
        last_attempted_at=attempted_at,
        finished_at=finished_at,
        errors=list(errors),
        worker_ids=[*earlier, worker_id],
        return_value=return_value,
    )

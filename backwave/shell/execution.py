"""Running one attempt: route it through the registry, call the task inside its scope, and
describe what happened. Shared by the production pump and the deterministic test pump."""

from __future__ import annotations

import json
from inspect import iscoroutinefunction
import logging
import time
import traceback as traceback_module
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started

from backwave.core.events import JobResult
from backwave.core.jobs import ClaimedJob
from backwave.results import task_result_for_attempt

from .registry import TaskRegistry
from .scope import enter_attempt, leave_attempt

logger = logging.getLogger("backwave.execution")


class Unroutable(Exception):
    """The job cannot be run here: its task is unknown or its payload does not decode."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptReport:
    """What one attempt produced: the result the driver needs plus the shell's side channel."""

    job_id: int
    attempt: int
    result: JobResult
    return_value: Any = None
    error_class: str = ""
    traceback: str = ""
    duration: float = 0.0


class _Attempt:
    """One routed attempt between its start and its report: the parts sync and async share."""

    __slots__ = ("job", "task", "args", "kwargs", "result", "sender", "started", "max_traceback_chars")

    def __init__(self, job, task, args, kwargs, *, sender, worker_id: str, started: float, max_traceback_chars: int):
        self.job, self.task, self.args, self.kwargs = job, task, args, kwargs
        self.result = _running_result(job, task, worker_id)
        self.sender = sender
        self.started = started
        self.max_traceback_chars = max_traceback_chars

    def announce(self) -> None:
        task_started.send(sender=self.sender, task_result=self.result)

    def arguments(self) -> tuple[list, dict]:
        if self.task.takes_context:
            return [TaskContext(task_result=self.result), *self.args], self.kwargs
        return self.args, self.kwargs

    def failed(self, error: BaseException) -> AttemptReport:
        duration = time.monotonic() - self.started
        error_class = f"{type(error).__module__}.{type(error).__qualname__}"
        text = "".join(traceback_module.format_exception(error))
        if len(text) > self.max_traceback_chars:
            text = "…(truncated)\n" + text[-self.max_traceback_chars :]
        object.__setattr__(self.result, "status", TaskResultStatus.FAILED)
        self.result.errors.append(TaskError(exception_class_path=error_class, traceback=text))
        _send_finished(self.sender, self.result)
        job = self.job
        return AttemptReport(job_id=job.id, attempt=job.attempt, result="failed", error_class=error_class, traceback=text, duration=duration)

    def succeeded(self, encoded) -> AttemptReport:
        object.__setattr__(self.result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", encoded)
        _send_finished(self.sender, self.result)
        job = self.job
        return AttemptReport(job_id=job.id, attempt=job.attempt, result="succeeded", return_value=encoded, duration=time.monotonic() - self.started)


def _begin(job: ClaimedJob, registry: TaskRegistry, worker_id: str, max_traceback_chars: int, backend_class) -> _Attempt | AttemptReport:
    """Route the job: an _Attempt ready to run, or the report of an unroutable (quarantined) one."""
    started = time.monotonic()
    try:
        task, args, kwargs = route(job, registry)
    except Unroutable as unroutable:
        logger.error("Job %s quarantined: %s", job.id, unroutable)
        return AttemptReport(
            job_id=job.id,
            attempt=job.attempt,
            result="unroutable",
            error_class=f"{Unroutable.__module__}.{Unroutable.__qualname__}",
            traceback=str(unroutable),
            duration=time.monotonic() - started,
        )
    sender = backend_class or registry.sender(task)
    return _Attempt(job, task, args, kwargs, sender=sender, worker_id=worker_id, started=started, max_traceback_chars=max_traceback_chars)


def is_async(job: ClaimedJob, registry: TaskRegistry) -> bool:
    """Whether the job's task is an ``async def`` (it then runs on the pump's event loop)."""
    task = registry.get(job.task_path)
    return task is not None and iscoroutinefunction(task.func)


def run_attempt(
    job: ClaimedJob,
    *,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    backend_class: type | None = None,
    enter: Callable[[], None] = enter_attempt,
    leave: Callable[[], None] = leave_attempt,
) -> AttemptReport:
    """Run ``job`` once and describe the outcome. Never raises: a handler's exception (SystemExit
    included) is the attempt's outcome, not the pump's problem. ``enter`` and ``leave`` wrap the
    handler: the attempt scope in a worker; the test pump's own, which keeps the test's connection."""
    attempt = _begin(job, registry, worker_id, max_traceback_chars, backend_class)
    if isinstance(attempt, AttemptReport):
        return attempt
    try:
        enter()
        try:
            attempt.announce()
            args, kwargs = attempt.arguments()
            encoded = _json_value(attempt.task.call(*args, **kwargs))
        finally:
            leave()
    except BaseException as error:
        return attempt.failed(error)
    return attempt.succeeded(encoded)


async def run_attempt_async(
    job: ClaimedJob,
    *,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    enter: Callable[[], None] = enter_attempt,
    leave: Callable[[], None] = leave_attempt,
) -> AttemptReport:
    """run_attempt for an ``async def`` task, on an event loop. The scope's connection handling
    runs through sync_to_async, as Django's ASGI handler does around a request."""
    attempt = _begin(job, registry, worker_id, max_traceback_chars, None)
    if isinstance(attempt, AttemptReport):
        return attempt
    try:
        await sync_to_async(enter)()
        try:
            attempt.announce()
            args, kwargs = attempt.arguments()
            encoded = _json_value(await attempt.task.acall(*args, **kwargs))
        finally:
            await sync_to_async(leave)()
    except BaseException as error:
        return attempt.failed(error)
    return attempt.succeeded(encoded)


def route(job: ClaimedJob, registry: TaskRegistry):
    """Resolve the task from the registry and check the payload's shape."""
    task = registry.get(job.task_path)
    if task is None:
        raise Unroutable(f"no task named {job.task_path!r} is registered in this worker")
    payload = job.payload
    if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
        raise Unroutable(f"payload of job {job.id} is not an object with 'args' and 'kwargs': {payload!r:.200}")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise Unroutable(f"payload of job {job.id} has args of type {type(args).__name__} and kwargs of type {type(kwargs).__name__}")
    return task, args, kwargs


def _json_value(value: Any) -> Any:
    """The return value as it will be stored: JSON, or the attempt fails with a clear error."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as error:
        raise TypeError(f"the task returned a {type(value).__name__}, which is not JSON-serialisable: {error}") from error


def _running_result(job: ClaimedJob, task, worker_id: str) -> TaskResult:
    return task_result_for_attempt(
        task=task,
        job_id=job.id,
        attempt=job.attempt,
        worker_id=worker_id,
        payload=job.payload,
        backend=job.backend,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        attempted_at=job.attempted_at,
        earlier_worker_ids=job.previous_worker_ids,
    )


def _send_finished(sender, task_result: TaskResult) -> None:
    try:
        task_finished.send(sender=sender, task_result=task_result)
    except Exception:
        logger.exception("A task_finished receiver failed for job %s", task_result.id)

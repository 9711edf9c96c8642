"""Running one attempt: route it through the registry, call the task inside its scope, and
describe what happened. Shared by the production pump and the deterministic test pump."""

from __future__ import annotations

import json
import logging
import time
import traceback as traceback_module
from dataclasses import dataclass
from typing import Any

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


def run_attempt(job: ClaimedJob, *, registry: TaskRegistry, worker_id: str, max_traceback_chars: int, backend_class: type | None = None) -> AttemptReport:
    """Run ``job`` once and describe the outcome. Never raises (but for KeyboardInterrupt and
    SystemExit): a handler's exception is the attempt's outcome, not the pump's problem."""
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
    task_result = _running_result(job, task, worker_id)
    sender = backend_class or registry.sender(task)
    try:
        enter_attempt()
        try:
            task_started.send(sender=sender, task_result=task_result)
            if task.takes_context:
                value = task.call(TaskContext(task_result=task_result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            encoded = _json_value(value)
        finally:
            leave_attempt()
    except BaseException as error:  # SystemExit from a handler too: the attempt failed; the driver decides
        duration = time.monotonic() - started
        error_class = f"{type(error).__module__}.{type(error).__qualname__}"
        text = "".join(traceback_module.format_exception(error))
        if len(text) > max_traceback_chars:
            text = "…(truncated)\n" + text[-max_traceback_chars:]
        object.__setattr__(task_result, "status", TaskResultStatus.FAILED)
        task_result.errors.append(TaskError(exception_class_path=error_class, traceback=text))
        _send_finished(sender, task_result)
        return AttemptReport(job_id=job.id, attempt=job.attempt, result="failed", error_class=error_class, traceback=text, duration=duration)
    object.__setattr__(task_result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(task_result, "_return_value", encoded)
    _send_finished(sender, task_result)
    return AttemptReport(job_id=job.id, attempt=job.attempt, result="succeeded", return_value=encoded, duration=time.monotonic() - started)


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

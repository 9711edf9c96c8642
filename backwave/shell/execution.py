"""Running one attempt: route it through the registry, call the task inside its scope, and
describe what happened. Shared by the production pump and the deterministic test pump.

Whatever the task hands back is made storable here, inside the attempt, so it can only ever cost
this attempt: a return value PostgreSQL cannot store, or one over MAX_RESULT_BYTES, fails the
attempt with ``backwave.UnstorableResult`` (retried under the task's normal rules), and the error
class and traceback are cleaned and cut to what their columns hold (``backwave/store/storable.py``).

Django's ``task_started`` is sent here, as the attempt starts; ``task_finished`` is not: the pump
sends it (``send_finished``) once the attempt's outcome is written, and only if the fence let it
through, so a receiver never hears of an outcome that did not stick.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback as traceback_module
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started

from backwave.conf import DEFAULTS
from backwave.redaction import redacted_text
from backwave.core.events import JobResult
from backwave.core.jobs import ClaimedJob
from backwave.tasking.results import task_result_for_attempt
from backwave.store.contract import OutcomeRecord
from backwave.store.storable import clean_text, cut_tail, encode_result, error_class_text

from backwave.tasking.registry import TaskRegistry
from backwave.tracing import attempt_span
from .scope import enter_attempt, leave_attempt

logger = logging.getLogger("backwave.execution")

DEFAULT_MAX_RESULT_BYTES = DEFAULTS["MAX_RESULT_BYTES"]


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
    # The job's queue and task path as claimed: the worker's metrics label each outcome with them.
    queue: str = ""
    task_path: str = ""
    # For task_finished, sent once the outcome is written: the attempt's TaskResult (None for an
    # unroutable job, which never started) and the backend class it is sent from.
    task_result: TaskResult | None = field(default=None, compare=False, repr=False)
    sender: type | None = field(default=None, compare=False, repr=False)


class _Attempt:
    """One routed attempt between its start and its report: the parts sync and async share."""

    __slots__ = ("job", "task", "args", "kwargs", "result", "sender", "started", "max_traceback_chars", "max_result_bytes")

    def __init__(self, job, task, args, kwargs, *, sender, worker_id: str, started: float, max_traceback_chars: int, max_result_bytes: int):
        self.job, self.task, self.args, self.kwargs = job, task, args, kwargs
        self.result = _running_result(job, task, worker_id)
        self.sender = sender
        self.started = started
        self.max_traceback_chars = max_traceback_chars
        self.max_result_bytes = max_result_bytes

    def announce(self) -> None:
        task_started.send(sender=self.sender, task_result=self.result)

    def arguments(self) -> tuple[list, dict]:
        if self.task.takes_context:
            return [TaskContext(task_result=self.result), *self.args], self.kwargs
        return self.args, self.kwargs

    def storable(self, value: Any) -> Any:
        return _json_value(value, max_bytes=self.max_result_bytes)

    def failed(self, error: BaseException) -> AttemptReport:
        duration = time.monotonic() - self.started
        error_class = _error_class(error)
        text = _traceback_text(error, error_class, self.max_traceback_chars)
        object.__setattr__(self.result, "status", TaskResultStatus.FAILED)
        self.result.errors.append(TaskError(exception_class_path=error_class, traceback=text))
        job = self.job
        return AttemptReport(
            job_id=job.id, attempt=job.attempt, result="failed", error_class=error_class, traceback=text, duration=duration,
            queue=job.queue, task_path=job.task_path, task_result=self.result, sender=self.sender,
        )

    def succeeded(self, encoded) -> AttemptReport:
        object.__setattr__(self.result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", encoded)
        job = self.job
        return AttemptReport(
            job_id=job.id, attempt=job.attempt, result="succeeded", return_value=encoded, duration=time.monotonic() - self.started,
            queue=job.queue, task_path=job.task_path, task_result=self.result, sender=self.sender,
        )


def _begin(job: ClaimedJob, registry: TaskRegistry, worker_id: str, max_traceback_chars: int, max_result_bytes: int, backend_class) -> _Attempt | AttemptReport:
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
            queue=job.queue,
            task_path=job.task_path,
        )
    sender = backend_class or registry.sender(task)
    return _Attempt(
        job, task, args, kwargs, sender=sender, worker_id=worker_id, started=started,
        max_traceback_chars=max_traceback_chars, max_result_bytes=max_result_bytes,
    )


def is_async(job: ClaimedJob, registry: TaskRegistry) -> bool:
    """Whether the job's task is an ``async def`` (it then runs on the pump's event loop)."""
    task = registry.get(job.task_path)
    return task is not None and iscoroutinefunction(task.func)


def run_attempt(job: ClaimedJob, *, worker_id: str, **options) -> AttemptReport:
    """``_run_attempt`` inside the attempt's OpenTelemetry span (a no-op without opentelemetry)."""
    with attempt_span(job, worker_id) as span:
        return span.finished(_run_attempt(job, worker_id=worker_id, **options))


async def run_attempt_async(job: ClaimedJob, *, worker_id: str, **options) -> AttemptReport:
    """``_run_attempt_async`` inside the attempt's OpenTelemetry span."""
    with attempt_span(job, worker_id) as span:
        return span.finished(await _run_attempt_async(job, worker_id=worker_id, **options))


def _run_attempt(
    job: ClaimedJob,
    *,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    backend_class: type | None = None,
    enter: Callable[[], None] = enter_attempt,
    leave: Callable[[], None] = leave_attempt,
) -> AttemptReport:
    """Run ``job`` once and describe the outcome. Never raises: a handler's exception (SystemExit
    included) is the attempt's outcome, not the pump's problem. ``enter`` and ``leave`` wrap the
    handler: the attempt scope in a worker; the test pump's own, which keeps the test's connection."""
    attempt = _begin(job, registry, worker_id, max_traceback_chars, max_result_bytes, backend_class)
    if isinstance(attempt, AttemptReport):
        return attempt
    try:
        enter()
        try:
            attempt.announce()
            args, kwargs = attempt.arguments()
            encoded = attempt.storable(attempt.task.call(*args, **kwargs))
        finally:
            leave()
    except BaseException as error:
        return attempt.failed(error)
    return attempt.succeeded(encoded)


async def _run_attempt_async(
    job: ClaimedJob,
    *,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    enter: Callable[[], None] = enter_attempt,
    leave: Callable[[], None] = leave_attempt,
) -> AttemptReport:
    """run_attempt for an ``async def`` task, on an event loop. The scope's connection handling
    runs through sync_to_async, as Django's ASGI handler does around a request."""
    attempt = _begin(job, registry, worker_id, max_traceback_chars, max_result_bytes, None)
    if isinstance(attempt, AttemptReport):
        return attempt
    try:
        await sync_to_async(enter)()
        try:
            attempt.announce()
            args, kwargs = attempt.arguments()
            encoded = attempt.storable(await attempt.task.acall(*args, **kwargs))
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
        # The text is logged and stored as the attempt's error: sensitive keys stay hidden.
        raise Unroutable(f"payload of job {job.id} is not an object with 'args' and 'kwargs': {redacted_text(payload)}")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise Unroutable(f"payload of job {job.id} has args of type {type(args).__name__} and kwargs of type {type(kwargs).__name__}")
    return task, args, kwargs


def _json_value(value: Any, *, max_bytes: int) -> Any:
    """The return value as it will be stored (its JSON round trip), or UnstorableResult: raised
    inside the attempt, so it fails this attempt and nothing else."""
    if value is None or value is True or value is False:
        return value
    # The common scalars cannot be unstorable: no encoding needed (ints far below the digit limit).
    if (type(value) is int and value.bit_length() < 64) or (type(value) is float and math.isfinite(value)):
        return value
    return json.loads(encode_result(value, max_bytes=max_bytes))


def _error_class(error: BaseException) -> str:
    """The exception's dotted path, as backwave_attempt.error_class holds it."""
    kind = type(error)
    return error_class_text(f"{kind.__module__}.{kind.__qualname__}")


def _traceback_text(error: BaseException, error_class: str, max_chars: int) -> str:
    """The traceback as the attempt row keeps it: a NUL or a lone surrogate (a file name decoded
    with surrogateescape) shown escaped, then cut to ``max_chars``, marker included."""
    try:
        text = "".join(traceback_module.format_exception(error))
    except Exception as formatting:  # the attempt's report must never fail to be made
        text = f"{error_class}: (its traceback could not be formatted: {type(formatting).__name__})\n"
    return cut_tail(clean_text(text), max_chars)


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


def send_finished(report: AttemptReport, written: OutcomeRecord | None = None) -> None:
    """Django's task_finished for an attempt whose outcome the store applied: sent once, after the
    write landed, from the pump's thread. ``written`` is the record the store wrote in place of
    the attempt's own when it could not store that one (backwave.UnstorableResult): the signal
    then says what was stored, a failure. A receiver that raises is logged; the others still run,
    and neither the batch nor the pump ever hears of it."""
    result = report.task_result
    if result is None:
        return  # an unroutable job never started: no task_started, no task_finished
    try:
        if written is not None:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            object.__setattr__(result, "_return_value", None)
            result.errors.append(TaskError(exception_class_path=written.error_class, traceback=written.traceback))
        # send_robust: every receiver runs, and each one's exception is logged by Django
        # ("django.dispatch", with its traceback) instead of raised into the pump.
        task_finished.send_robust(sender=report.sender, task_result=result)
    except Exception:
        logger.exception("task_finished could not be sent for job %s", result.id)

"""Running one attempt: route it through the registry, call the task inside its scope, and
describe what happened. Shared by the production pump and the deterministic test pump.

Whatever the task hands back is made storable here, inside the attempt, so it can only ever cost
this attempt: a return value PostgreSQL cannot store, or one over MAX_RESULT_BYTES, fails the
attempt with ``backwave.UnstorableResult`` (retried under the task's normal rules), and the error
class and traceback are cleaned and cut to what their columns hold (``backwave/store/storable.py``).

Django's ``task_started`` is sent here, as the attempt starts; ``task_finished`` is not: the pump
sends it (``send_finished``) once the attempt's outcome is written, and only if the fence let it
through, so a receiver never hears of an outcome that did not stick; a failure's is sent with
the handler's exception being handled, as Django's backends send it from their ``except``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
import traceback as traceback_module
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from inspect import iscoroutinefunction
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started

from backwave.conf import DEFAULTS
from backwave.ops.redaction import redacted_text
from backwave.core.events import JobResult
from backwave.core.jobs import ClaimedJob, OutcomeKind
from backwave.tasking.results import task_result_for_attempt
from backwave.store.contract import Applied, OutcomeRecord, ProgressReport
from backwave.store.storable import UnstorableResult, clean_text, cut_tail, encode_result, error_class_text

from backwave.tasking.context import AttemptControl, JobContext, database_resolver
from backwave.tasking.control import Cancelled, Discard, Snooze, TimeLimitExceeded, seconds_of
from backwave.tasking.registry import TaskRegistry
from backwave.tracing import NO_SPAN, attempt_span
from .scope import enter_attempt, leave_attempt

logger = logging.getLogger("backwave.execution")

DEFAULT_MAX_RESULT_BYTES = DEFAULTS["MAX_RESULT_BYTES"]


class Unroutable(Exception):
    """The job cannot be run here: its task is unknown or its payload does not decode."""


# Not frozen: one is built per attempt, and a frozen dataclass's __init__ sets each of its 17
# fields through object.__setattr__ (2.5 us a report more). Nothing changes one once built.
@dataclass(slots=True, kw_only=True)
class AttemptReport:
    """What one attempt produced: the result the driver needs plus the shell's side channel."""

    job_id: int
    attempt: int
    result: JobResult
    return_value: Any = None
    error_class: str = ""
    traceback: str = ""
    duration: float = 0.0
    # The JobContext's side channels (Job Output, tag deltas), kept whether the handler returned
    # or raised: they ride the outcome into the batched write.
    output: dict[str, Any] | None = None
    tags_added: tuple[str, ...] = ()
    tags_removed: tuple[str, ...] = ()
    delay: float | None = None  # snoozed: seconds to wait; failed: the task's backoff() (None: the default)
    progress: Any = None  # the attempt's last set_progress() and metadata, for the outcome
    metadata: Any = None
    # The job's queue and task path as claimed: the worker's metrics label each outcome with them.
    queue: str = ""
    task_path: str = ""
    # For task_finished, sent once the outcome is written: the attempt's TaskResult (None for an
    # unroutable job, which never started) and the backend class it is sent from.
    task_result: TaskResult | None = field(default=None, compare=False, repr=False)
    sender: type | None = field(default=None, compare=False, repr=False)
    # A failed attempt's exception, for task_finished's receivers (Django's log_task_finished
    # reads it from sys.exc_info()); None for any other end.
    exception: BaseException | None = field(default=None, compare=False, repr=False)


class _Attempt:
    """One routed attempt between its start and its report: the parts sync and async share."""

    __slots__ = (
        "job",
        "task",
        "args",
        "kwargs",
        "result",
        "sender",
        "started",
        "max_traceback_chars",
        "max_result_bytes",
        "control",
        "context",
    )

    def __init__(
        self,
        job,
        task,
        args,
        kwargs,
        *,
        sender,
        worker_id: str,
        started: float,
        max_traceback_chars: int,
        max_result_bytes: int,
        clock=time.monotonic,
        control: AttemptControl | None = None,
    ):
        self.job, self.task, self.args, self.kwargs = job, task, args, kwargs
        self.result = _running_result(job, task, worker_id)
        self.sender = sender
        self.started = started
        self.max_traceback_chars = max_traceback_chars
        self.max_result_bytes = max_result_bytes
        self.control = (
            control
            if control is not None
            else AttemptControl(job_id=job.id, attempt=job.attempt, timeout=job.timeout, clock=clock)
        )
        self.control.started_as = (self.result, sender, job.queue, job.task_path)
        # Made before the handler runs (and before its try), so whatever the handler recorded
        # through it is read back however the handler ends.
        self.context = (
            JobContext(
                task_result=self.result,
                job_id=job.id,
                max_output_bytes=max_result_bytes,
                resolver=_resolver_for(job),
                control=self.control,
            )
            if task.takes_context
            else None
        )

    def announce(self) -> None:
        task_started.send(sender=self.sender, task_result=self.result)

    def arguments(self) -> tuple[list, dict]:
        if self.context is not None:
            return [self.context, *self.args], self.kwargs
        return self.args, self.kwargs

    def side_channels(self) -> dict[str, Any]:
        """What the handler recorded through its context; the context records nothing more."""
        if self.context is None:
            return {}
        output, added, removed = self.context.close()
        return {"output": output, "tags_added": added, "tags_removed": removed}

    def storable(self, value: Any) -> Any:
        encoded = _json_value(value, max_bytes=self.max_result_bytes)
        if self.context is not None and self.context.metadata:
            # Saved with the outcome (Django's proposed metadata API); checked here, inside the attempt.
            self.control.save_metadata(self.context.metadata)
        return encoded

    def failed(self, error: BaseException) -> AttemptReport:
        duration = time.monotonic() - self.started
        if self.context is not None and self.context.metadata:
            try:
                self.control.save_metadata(self.context.metadata)
            except ValueError:
                logger.warning("Job %s: its metadata cannot be stored and is left out", self.job.id, exc_info=True)
        result, delay = self._verdict(error)
        error_class = _error_class(error)
        if result == "snoozed":
            text = f"{error_class}: {error}\n"  # not a failure: no traceback to read
            object.__setattr__(self.result, "status", TaskResultStatus.READY)
            exception = None
        else:
            text = _traceback_text(error, error_class, self.max_traceback_chars)
            object.__setattr__(self.result, "status", TaskResultStatus.FAILED)
            self.result.errors.append(TaskError(exception_class_path=error_class, traceback=text))
            exception = error
        job = self.job
        return AttemptReport(
            job_id=job.id,
            attempt=job.attempt,
            result=result,
            error_class=error_class,
            traceback=text,
            duration=duration,
            delay=delay,
            progress=self.control.last_progress,
            metadata=self.control.last_metadata,
            queue=job.queue,
            task_path=job.task_path,
            task_result=self.result,
            sender=self.sender,
            exception=exception,
            **self.side_channels(),
        )

    def succeeded(self, encoded) -> AttemptReport:
        object.__setattr__(self.result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", encoded)
        job = self.job
        return AttemptReport(
            job_id=job.id,
            attempt=job.attempt,
            result="cancelled" if self.control.cancelled else "succeeded",
            return_value=encoded,
            duration=time.monotonic() - self.started,
            progress=self.control.last_progress,
            metadata=self.control.last_metadata,
            queue=job.queue,
            task_path=job.task_path,
            task_result=self.result,
            sender=self.sender,
            **self.side_channels(),
        )

    def _verdict(self, error: BaseException) -> tuple[JobResult, float | None]:
        """What the handler's exception makes of the attempt: the task's rules, then its backoff."""
        if self.control.cancelled:
            return "cancelled", None
        if isinstance(error, Snooze):
            return "snoozed", error.seconds
        if isinstance(error, Discard):
            return "discarded", None
        task = self.task
        discard_on, retry_on = getattr(task, "discard_on", ()), getattr(task, "retry_on", ())
        if (discard_on and isinstance(error, discard_on)) or (retry_on and not isinstance(error, retry_on)):
            return "discarded", None
        backoff = getattr(task, "backoff", None)
        if backoff is None:
            return "failed", None
        try:
            delay = backoff(self.job.counted_attempt, error)
            return ("discarded", None) if delay is None else ("failed", seconds_of(delay, what="backoff()'s answer"))
        except BaseException:  # even a SystemExit: the attempt must still be reported
            # The task's own backoff is broken: the default backoff still retries the job.
            logger.exception(
                "backoff() of task %s failed for job %s; the default backoff applies", self.job.task_path, self.job.id
            )
            return "failed", None


def _begin(
    job: ClaimedJob,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    max_result_bytes: int,
    backend_class,
    clock=time.monotonic,
    control: AttemptControl | None = None,
) -> _Attempt | AttemptReport:
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
        job,
        task,
        args,
        kwargs,
        sender=sender,
        worker_id=worker_id,
        started=started,
        max_traceback_chars=max_traceback_chars,
        max_result_bytes=max_result_bytes,
        clock=clock,
        control=control,
    )


def _begin_under(
    controls: AttemptControls,
    job: ClaimedJob,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    max_result_bytes: int,
    backend_class,
    clock,
) -> _Attempt | AttemptReport:
    """_begin with the control the pump registered for the job (one is made and added when it
    runs outside a pump); an unroutable job's control is dropped, as it never ran."""
    registered = controls.get(job)
    attempt = _begin(job, registry, worker_id, max_traceback_chars, max_result_bytes, backend_class, clock, registered)
    if isinstance(attempt, AttemptReport):
        controls.forget(job)
    elif registered is None:
        controls.add(attempt.control)
    return attempt


def _resolver_for(job: ClaimedJob):
    """Ancestors are read on the handler thread's connection to the database of the job's backend."""
    from django.tasks import task_backends

    try:
        database = getattr(task_backends[job.backend], "database", "default")
    except Exception:  # a backend alias no longer configured: its jobs live where the default's do
        database = "default"
    return database_resolver(database)


class AttemptControls:
    """The controls of a pump's running attempts, by (job id, attempt): the pump thread registers
    each as it hands the job over, stops one (StopAttempt) and collects what to report with the
    heartbeat; the handler thread takes its own and discards it at the end.

    No lock: each method is one operation on a dict (a store, a lookup, a pop, a copy of its
    values), and those are atomic on CPython's dict. A lock here cost three acquisitions a job,
    contended between the pump and sixteen handler threads, for a third of the worker's added
    time per job when attempt control came in."""

    def __init__(self):
        self._running: dict[tuple[int, int], AttemptControl] = {}

    def add(self, control: AttemptControl) -> None:
        self._running[(control.job_id, control.attempt)] = control

    def register(self, job: ClaimedJob) -> None:
        """The pump thread, as it hands the job to a thread: from now on a StopAttempt for it
        finds its control, however soon it comes (its time limit counts from here)."""
        self.add(AttemptControl(job_id=job.id, attempt=job.attempt, timeout=job.timeout))

    def get(self, job: ClaimedJob) -> AttemptControl | None:
        return self._running.get((job.id, job.attempt))

    def discard(self, control: AttemptControl) -> None:
        # Only the pump registers an attempt, once (a job claimed again has a new attempt
        # number), so nothing can replace this control between the lookup and the pop.
        key = (control.job_id, control.attempt)
        if self._running.get(key) is control:
            self._running.pop(key, None)

    def stop(self, job_id: int, attempt: int, reason: str) -> AttemptControl | None:
        """Flag that attempt's handler to stop; its control, or None when it is not running (any more)."""
        control = self._running.get((job_id, attempt))
        if control is None:
            return None
        control.stop(reason)
        return control

    def forget(self, job: ClaimedJob) -> None:
        self._running.pop((job.id, job.attempt), None)

    def stopped_running(self) -> list[AttemptControl]:
        """The attempts told to stop whose handlers still run."""
        return [control for control in self._running.copy().values() if control.stop_reason]

    def reports(self) -> list[ProgressReport]:
        """Every running attempt's progress and metadata set since the last call."""
        return [report for control in self._running.copy().values() if (report := control.take_report()) is not None]


def is_atomic(job: ClaimedJob, registry: TaskRegistry) -> bool:
    """Whether the job's task runs in a transaction with its own outcome (``atomic=True``)."""
    task = registry.get(job.task_path)
    return task is not None and getattr(task, "atomic", False)


def is_async(job: ClaimedJob, registry: TaskRegistry) -> bool:
    """Whether the job's task is an ``async def`` (it then runs on the pump's event loop)."""
    task = registry.get(job.task_path)
    return task is not None and _is_coroutine_function(task.func)


# Asked for every job handed over; inspect's answer walks the function's wrappers and flags
# each time (a worker runs few distinct functions, all of them module-level).
_is_coroutine_function = functools.lru_cache(maxsize=1024)(iscoroutinefunction)


def run_attempt(job: ClaimedJob, *, worker_id: str, **options) -> AttemptReport:
    """``_run_attempt`` inside the attempt's OpenTelemetry span (none without opentelemetry or a
    tracer: then the attempt runs bare, without entering and leaving a span that does nothing)."""
    span = attempt_span(job, worker_id)
    if span is NO_SPAN:
        return _run_attempt(job, worker_id=worker_id, **options)
    with span as recording:
        return recording.finished(_run_attempt(job, worker_id=worker_id, **options))


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
    controls: AttemptControls | None = None,
    clock: Callable[[], float] = time.monotonic,
    commit: Commit | None = None,
) -> AttemptReport:
    """Run ``job`` once and describe the outcome. Never raises: a handler's exception (SystemExit
    included) is the attempt's outcome, not the pump's problem. ``enter`` and ``leave`` wrap the
    handler: the attempt scope in a worker; the test pump's own, which keeps the test's connection.
    ``commit`` is how an atomic task's success is written in its transaction (see run_atomic)."""
    controls = controls if controls is not None else AttemptControls()
    attempt = _begin_under(controls, job, registry, worker_id, max_traceback_chars, max_result_bytes, backend_class, clock)
    if isinstance(attempt, AttemptReport):
        return attempt
    try:
        enter()
        try:
            attempt.announce()
            args, kwargs = attempt.arguments()
            if getattr(attempt.task, "atomic", False) and commit is not None:
                return _run_atomic(attempt, args, kwargs, commit)
            encoded = attempt.storable(attempt.task.call(*args, **kwargs))
        finally:
            leave()
    except BaseException as error:
        return attempt.failed(error)
    finally:
        controls.discard(attempt.control)
    return attempt.succeeded(encoded)


class Commit(NamedTuple):
    """Where an atomic task's transaction runs (a Django database alias) and how its outcome is
    written on that connection: ``write(psycopg connection, record) -> Applied``, fenced by the
    lease, inside the transaction Django's ``atomic()`` opened on it."""

    alias: str
    write: Callable[[Any, OutcomeRecord], Applied]


class _NotCommitted(Exception):
    """Raised inside an atomic task's transaction to roll it back: the fence refused the outcome
    (the lease was lost) or the store could not take it as given."""


def _run_atomic(attempt: _Attempt, args, kwargs, commit: Commit) -> AttemptReport:
    """Run an atomic task inside ``transaction.atomic`` on ``commit.alias`` and write its
    success there, so its writes and its outcome commit together or not at all.

    A handler that raises rolls its writes back and is an ordinary failed attempt (retried by the
    batch path). A success the fence refuses rolls the handler's writes back too, and is reported
    as a plain success, which the batch write then finds refused as well: a zombie's effects
    never land. Only a committed success reports "committed" (the driver writes nothing more),
    and task_finished is sent for it here, after the commit."""
    job = attempt.job
    try:
        with transaction.atomic(using=commit.alias):
            encoded = attempt.storable(attempt.task.call(*args, **kwargs))
            report = attempt.succeeded(encoded)
            record = OutcomeRecord(
                job_id=job.id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED, return_value=encoded, duration=report.duration
            )
            django_connection = connections[commit.alias]
            django_connection.ensure_connection()
            applied = commit.write(django_connection.connection, record)
            if job.id not in applied or applied.replaced:
                raise _NotCommitted
    except _NotCommitted:
        logger.warning(
            "Atomic job %s attempt %s: the lease fence refused its outcome; its writes were rolled back", job.id, job.attempt
        )
        return report
    committed = replace(report, result="committed")
    send_finished(committed)
    return committed


async def _run_attempt_async(
    job: ClaimedJob,
    *,
    registry: TaskRegistry,
    worker_id: str,
    max_traceback_chars: int,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    enter: Callable[[], None] = enter_attempt,
    leave: Callable[[], None] = leave_attempt,
    controls: AttemptControls | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AttemptReport:
    """run_attempt for an ``async def`` task, on an event loop. The scope's connection handling
    runs through sync_to_async, as Django's ASGI handler does around a request."""
    controls = controls if controls is not None else AttemptControls()
    attempt = _begin_under(controls, job, registry, worker_id, max_traceback_chars, max_result_bytes, None, clock)
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
    finally:
        controls.discard(attempt.control)
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
        raise Unroutable(
            f"payload of job {job.id} has args of type {type(args).__name__} and kwargs of type {type(kwargs).__name__}"
        )
    return task, args, kwargs


def _json_value(value: Any, *, max_bytes: int) -> Any:
    """The return value as it will be stored (its JSON round trip), or UnstorableResult: raised
    inside the attempt, so it fails this attempt and nothing else. A value of a type JSON has not
    raises the TypeError Django's backends record for it instead ("Unsupported type: <class 'set'>"),
    with BackWave's where and what after Django's sentence."""
    if value is None or value is True or value is False:
        return value
    # The common scalars cannot be unstorable: no encoding needed (ints far below the digit limit).
    if (type(value) is int and value.bit_length() < 64) or (type(value) is float and math.isfinite(value)):
        return value
    try:
        return json.loads(encode_result(value, max_bytes=max_bytes))
    except UnstorableResult as error:
        if error.unsupported_type is None:
            raise
        raise TypeError(f"Unsupported type: {error.unsupported_type}: {error}") from None


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
    the attempt's own when it could not store that one (backwave.UnstorableResult), or the
    driver's when it ended the attempt (a time limit): the signal then says what was stored, a
    failure. A receiver that raises is logged; the others still run, and neither the batch nor
    the pump ever hears of it."""
    send_finished_for(report.task_result, report.sender, written, report.exception)


def send_finished_for(
    result: TaskResult | None, sender: type | None, written: OutcomeRecord | None = None, exception: BaseException | None = None
) -> None:
    """send_finished for an attempt known by its TaskResult and sender alone (and the exception
    its handler raised, if it failed).

    A failure is signalled while its exception is being handled, as Django's own backends send
    task_finished from inside their ``except``: receivers that read ``sys.exc_info()`` (Django's
    log_task_finished) see it with its traceback, though the write it waited for ran later, on
    another thread. What the store or the driver wrote in the attempt's place is the exception
    then, the handler's own (if any) its cause."""
    if result is None:
        return  # an unroutable job never started: no task_started, no task_finished
    try:
        if written is not None:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            object.__setattr__(result, "_return_value", None)
            result.errors.append(TaskError(exception_class_path=written.error_class, traceback=written.traceback))
            exception = _stored_error(written, exception)
        if exception is None:
            # send_robust: every receiver runs, and each one's exception is logged by Django
            # ("django.dispatch", with its traceback) instead of raised into the pump.
            task_finished.send_robust(sender=sender, task_result=result)
            return
        traceback = exception.__traceback__
        try:
            raise exception
        except BaseException:
            # Raising it here put this frame at the head of its traceback: the handler's is what
            # a receiver should read.
            exception.__traceback__ = traceback
            task_finished.send_robust(sender=sender, task_result=result)
    except Exception:
        logger.exception("task_finished could not be sent for job %s", result.id)


# The errors the store or the driver write in an attempt's place, by their stored class.
_STORED_ERRORS = {f"backwave.{kind.__qualname__}": kind for kind in (Cancelled, TimeLimitExceeded, UnstorableResult)}


def _stored_error(written: OutcomeRecord, cause: BaseException | None) -> BaseException | None:
    """The exception a record written in the attempt's place stands for (it was never raised:
    no traceback of its own), or the handler's own when the record is not one of those."""
    kind = _STORED_ERRORS.get(written.error_class)
    if kind is None:
        return cause
    error = kind(written.traceback.removeprefix(f"{written.error_class}: ").rstrip("\n"))
    error.__cause__ = cause
    return error

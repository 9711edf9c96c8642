"""OpenTelemetry: a span per attempt, the child of the span that enqueued the job.

Optional: with ``opentelemetry-api`` not installed, or installed without an SDK's tracer provider
set up, every function here does nothing (and costs an ``is None`` test, or a look at the global
provider). With it installed, an enqueue made inside a recording span stores that
span's W3C trace context (``traceparent``, and ``tracestate`` when there is one) on the job row
(``Job.trace_context``), and each attempt runs inside a CONSUMER span ``process <queue>`` whose
parent it is, so the trace of a request shows the jobs it caused, however long they waited and
on whichever worker they ran. The W3C format is used whatever propagator the application
configured globally: the row outlives any one process's configuration, and only these two keys
are kept (never baggage, which may carry application data into a table operators read).

Attributes follow OpenTelemetry's semantic conventions for messaging (``messaging.system``,
``messaging.operation.*``, ``messaging.destination.name``, ``messaging.message.id``), plus
``backwave.*`` for what they have no name for (the task, the attempt number, the outcome). A
failed attempt's span (failed, discarded, unroutable) has status ERROR, ``error.type`` and an
``exception`` event with the stored traceback; the other ends are no failure and leave the
status unset: a success however it was written (an atomic task's, committed by its attempt, is
``succeeded``), a snooze (the task asked to run later) and a cancel (an operator asked). A trace context that does not parse (a row written by hand) starts a new
trace instead: it never costs the attempt.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the optional dependency is not installed: tracing is off
    trace = None

# W3C Trace Context: traceparent is 55 characters; tracestate at most 32 members of 256.
CONTEXT_KEYS = ("traceparent", "tracestate")
MAX_CONTEXT_VALUE = 8192
SYSTEM = "backwave"

_propagator = TraceContextTextMapPropagator() if trace is not None else None
_tracer: tuple[Any, Any] = (None, None)  # (the provider, its tracer): asked for once per provider


# trace.get_tracer_provider() looks at os.environ on every call until a provider is set (5 us, a
# few percent of a no-op job): read the global it sets instead, while the API still has it.
_READ_GLOBAL = hasattr(trace, "_TRACER_PROVIDER") if trace is not None else False
_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _provider():
    """The tracer provider set up for this process, or None when none is."""
    if _READ_GLOBAL and not _PROVIDER_FROM_ENVIRONMENT:
        return trace._TRACER_PROVIDER  # noqa: SLF001 - see _READ_GLOBAL
    return trace.get_tracer_provider()


def _current_tracer():
    """BackWave's tracer, or None while no SDK is set up: the API alone records nothing, and
    making its non-recording spans would still cost every attempt microseconds."""
    global _tracer
    provider = _provider()
    if provider is None or isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider)):
        return None
    if _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(SYSTEM))
    return _tracer[1]


def enabled() -> bool:
    """Whether opentelemetry-api is installed (spans are then made; recorded if an SDK is set up)."""
    return trace is not None


def enqueue_trace_context() -> dict[str, str] | None:
    """The current span's W3C trace context, to store with the jobs enqueued now; None outside
    a valid span or without opentelemetry."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return {key: carrier[key] for key in CONTEXT_KEYS if isinstance(carrier.get(key), str) and carrier[key]} or None


def _parent(trace_context: Any):
    """The Context a stored trace context names, or None (a new trace) for anything else."""
    if not isinstance(trace_context, Mapping):
        return None
    carrier = {
        key: value for key in CONTEXT_KEYS if isinstance(value := trace_context.get(key), str) and len(value) <= MAX_CONTEXT_VALUE
    }
    if "traceparent" not in carrier:
        return None
    try:
        context = _propagator.extract(carrier)
    except Exception:  # a propagator bug must not cost the attempt
        return None
    return context if trace.get_current_span(context).get_span_context().is_valid else None


class _NoSpan:
    """``attempt_span`` when tracing is off: its own context manager, a shared one, so an
    attempt pays no generator for it."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def finished(self, report):
        return report


NO_SPAN = _NoSpan()  # what attempt_span returns when tracing is off (run_attempt skips it)

# The attempt's results that are failures; every other one ends its span without an error.
FAILURES = frozenset({"failed", "discarded", "unroutable"})
# An atomic task's success is reported "committed" (its attempt wrote it): a success all the same.
OUTCOME_NAMES = {"committed": "succeeded"}


class _AttemptSpan:
    __slots__ = ("span",)

    def __init__(self, span):
        self.span = span

    def finished(self, report):
        """Record the attempt's outcome on the span; returns ``report``."""
        span = self.span
        if span.is_recording():
            result = report.result
            span.set_attribute("backwave.outcome", OUTCOME_NAMES.get(result, result))
            if result in FAILURES:
                span.set_attribute("error.type", report.error_class)
                span.add_event("exception", {"exception.type": report.error_class, "exception.stacktrace": report.traceback})
                span.set_status(Status(StatusCode.ERROR, report.error_class))
        return report


def attempt_span(job, worker_id: str):
    """The attempt's span, current while the task runs (its own spans are its children): a
    context manager whose value's ``finished(report)`` records the outcome."""
    tracer = None if trace is None else _current_tracer()
    if tracer is None:
        return NO_SPAN
    return _recorded_span(tracer, job, worker_id)


@contextmanager
def _recorded_span(tracer, job, worker_id: str) -> Iterator[_AttemptSpan]:
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "backwave.task": job.task_path,
        "backwave.attempt": job.attempt,
        "backwave.worker_id": worker_id,
    }
    with tracer.start_as_current_span(
        f"process {job.queue}",
        context=_parent(job.trace_context),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield _AttemptSpan(span)

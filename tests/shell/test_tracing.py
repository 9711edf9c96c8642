"""OpenTelemetry spans per attempt, children of the span that enqueued the job: recorded with the
SDK's in-memory exporter, through the test pump (Django's connection) and a real worker's pumps
(PostgresStore), and a no-op in a process where opentelemetry cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from django.tasks import task
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backwave import tracing
from backwave.models import Job
from backwave.testing import DeterministicPump
from tests.factories import JobFactory
from tests.shell import worker_tasks
from tests.shell.conftest import ROOT, wait_until
from tests.shell.test_metrics import running_worker  # noqa: F401 - the in-process worker fixture

NOOP = "tests.shell.worker_tasks.noop"


@task(queue_name="e2e")
def makes_a_span():
    """A task with a span of its own: it must be a child of the attempt's span."""
    with trace.get_tracer("the-application").start_as_current_span("inside the task"):
        return "traced"


@pytest.fixture
def spans(monkeypatch):
    """An SDK tracer provider with an in-memory exporter, used by BackWave and the test alike
    (patched in, rather than set globally, which OpenTelemetry allows once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    monkeypatch.setattr(trace, "get_tracer", lambda name, *args, **kwargs: provider.get_tracer(name, *args, **kwargs))
    yield exporter
    provider.shutdown()


def attempt_spans(exporter, queue="e2e"):
    return [span for span in exporter.get_finished_spans() if span.name == f"process {queue}"]


@pytest.mark.django_db
def test_an_attempt_span_is_the_child_of_the_enqueue_span(spans):
    with trace.get_tracer("request").start_as_current_span("POST /signup") as request_span:
        result = worker_tasks.noop.enqueue(7)
    stored = Job.objects.get(id=result.id).trace_context
    parent = request_span.get_span_context()
    assert stored == {"traceparent": f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{parent.trace_flags:02x}"}

    pump = DeterministicPump(tasks=[worker_tasks.noop], queues=["e2e"])
    try:
        assert pump.drain().succeeded == 1
    finally:
        pump.close()
    (span,) = attempt_spans(spans)
    assert span.kind is SpanKind.CONSUMER
    assert (span.context.trace_id, span.parent.span_id) == (parent.trace_id, parent.span_id)
    assert dict(span.attributes) == {
        "messaging.system": "backwave",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "e2e",
        "messaging.message.id": result.id,
        "backwave.task": NOOP,
        "backwave.attempt": 1,
        "backwave.worker_id": pump.worker_id,
        "backwave.outcome": "succeeded",
    }
    assert span.status.status_code is StatusCode.UNSET


@pytest.mark.django_db
def test_an_enqueue_outside_any_span_stores_no_context_and_its_attempt_starts_a_trace(spans):
    result = worker_tasks.noop.enqueue(1)
    assert Job.objects.get(id=result.id).trace_context is None
    pump = DeterministicPump(tasks=[worker_tasks.noop], queues=["e2e"])
    try:
        pump.drain()
    finally:
        pump.close()
    (span,) = attempt_spans(spans)
    assert span.parent is None


@pytest.mark.django_db
def test_the_tasks_own_spans_are_children_of_the_attempt(spans):
    makes_a_span.enqueue()
    pump = DeterministicPump(tasks=[makes_a_span], queues=["e2e"])
    try:
        pump.drain()
    finally:
        pump.close()
    (attempt,) = attempt_spans(spans)
    (inner,) = [span for span in spans.get_finished_spans() if span.name == "inside the task"]
    assert inner.parent.span_id == attempt.context.span_id


@pytest.mark.django_db
@pytest.mark.parametrize(
    "context", [{"traceparent": "not a traceparent"}, ["a", "list"], {"traceparent": 5}, {"tracestate": "a=b"}]
)
def test_a_trace_context_that_does_not_parse_starts_a_new_trace(spans, context):
    JobFactory(task_path=NOOP, queue="e2e", trace_context=context)
    pump = DeterministicPump(tasks=[worker_tasks.noop], queues=["e2e"])
    try:
        assert pump.drain().succeeded == 1
    finally:
        pump.close()
    (span,) = attempt_spans(spans)
    assert span.parent is None


@pytest.mark.django_db(transaction=True)
def test_a_workers_failed_and_retried_attempts_are_error_spans_of_the_same_parent(spans, running_worker):
    with trace.get_tracer("request").start_as_current_span("enqueue") as request_span:
        failing = worker_tasks.always_fails.enqueue()  # two attempts, both fail
        flaky = worker_tasks.flaky.enqueue(succeed_on=2)  # fails once, then succeeds
    running_worker()
    wait_until(lambda: Job.objects.filter(state__in=["succeeded", "failed"]).count() == 2, "both jobs finished")
    wait_until(lambda: len(attempt_spans(spans)) == 4, "four attempt spans")
    parent = request_span.get_span_context()
    by_job: dict[str, list] = {}
    for span in attempt_spans(spans):
        assert (span.context.trace_id, span.parent.span_id) == (parent.trace_id, parent.span_id)
        by_job.setdefault(span.attributes["messaging.message.id"], []).append(span)
    failed = sorted(by_job[failing.id], key=lambda s: s.attributes["backwave.attempt"])
    assert [s.attributes["backwave.attempt"] for s in failed] == [1, 2]
    for span in failed:
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "builtins.ValueError"
        (event,) = span.events
        assert event.name == "exception" and "this task always fails" in event.attributes["exception.stacktrace"]
    outcomes = sorted((s.attributes["backwave.attempt"], s.attributes["backwave.outcome"]) for s in by_job[flaky.id])
    assert outcomes == [(1, "failed"), (2, "succeeded")]


@pytest.mark.django_db(transaction=True)
def test_a_workers_atomic_successes_and_snoozes_are_not_error_spans(spans, running_worker):
    """An atomic success (written by its attempt) and a snooze (the task asking to run later) are
    no failures: their spans carry no ERROR status and no exception event."""
    atomic = worker_tasks.atomic_noop.enqueue(3)
    snoozed = worker_tasks.snoozes_once.enqueue()
    running_worker(tasks=[worker_tasks.atomic_noop, worker_tasks.snoozes_once])
    wait_until(lambda: Job.objects.filter(state="succeeded").count() == 2, "both jobs succeeded")
    wait_until(lambda: len(attempt_spans(spans)) == 3, "three attempt spans")
    by_job: dict[str, list] = {}
    for span in attempt_spans(spans):
        by_job.setdefault(span.attributes["messaging.message.id"], []).append(span)
    (atomic_span,) = by_job[atomic.id]
    snooze_spans = sorted(by_job[snoozed.id], key=lambda s: s.attributes["backwave.attempt"])
    for span in (atomic_span, *snooze_spans):
        assert span.status.status_code is StatusCode.UNSET, (span.attributes["backwave.outcome"], span.status)
        assert list(span.events) == []
        assert "error.type" not in span.attributes
    # The outcome stored: an atomic success is a success, however it was written.
    assert atomic_span.attributes["backwave.outcome"] == "succeeded"
    assert [(s.attributes["backwave.attempt"], s.attributes["backwave.outcome"]) for s in snooze_spans] == [
        (1, "snoozed"),
        (2, "succeeded"),
    ]


@pytest.mark.django_db
def test_with_the_api_but_no_sdk_set_up_no_span_is_made(monkeypatch):
    made = []
    monkeypatch.setattr(trace.ProxyTracerProvider, "get_tracer", lambda *args, **kwargs: made.append(args) or trace.NoOpTracer())
    worker_tasks.noop.enqueue(1)
    pump = DeterministicPump(tasks=[worker_tasks.noop], queues=["e2e"])
    try:
        assert pump.drain().succeeded == 1
    finally:
        pump.close()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) and made == []
    assert tracing.enabled() and tracing._provider() is None


def test_a_provider_set_up_later_is_used_from_then_on(monkeypatch):
    """Read per attempt: set_tracer_provider after the worker started still takes effect."""
    provider = TracerProvider()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    assert tracing._provider() is provider
    assert tracing._current_tracer() is tracing._current_tracer() is not None


def test_without_opentelemetry_tracing_is_a_no_op():
    """A process where ``import opentelemetry`` fails: nothing is stored, attempts run as ever."""
    script = textwrap.dedent(
        """
        import sys

        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"No module named {name!r} (blocked by the test)")

        sys.meta_path.insert(0, NoOpenTelemetry())
        import django
        django.setup()
        from backwave import tracing
        from backwave.core.jobs import ClaimedJob
        from backwave.shell.execution import run_attempt
        from backwave.tasking.registry import TaskRegistry
        from tests.shell import worker_tasks

        assert not tracing.enabled() and tracing.enqueue_trace_context() is None
        job = ClaimedJob(
            id=1, task_path=worker_tasks.noop.module_path, queue="e2e", priority=0, payload={"args": [5], "kwargs": {}},
            attempt=1, max_attempts=1, backoff_base=1.0, backoff_max=1.0,
            trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        )
        report = run_attempt(
            job, registry=TaskRegistry([worker_tasks.noop]), worker_id="w", max_traceback_chars=1000,
            enter=lambda: None, leave=lambda: None,
        )
        assert (report.result, report.return_value) == ("succeeded", 5), report
        assert not any(name.startswith("opentelemetry") for name in sys.modules)
        print("no-op ok")
        """
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no-op ok" in done.stdout, done.stdout + done.stderr

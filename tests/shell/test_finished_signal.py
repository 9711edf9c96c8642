"""Django's task_finished: sent once per outcome the store applied, after it landed, from the
pump's thread; never for an outcome the fence refused. A real Pump against the real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.tasks.signals import task_finished

from backwave.backend import BackWaveBackend
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Attempt, Job
from backwave.models import Pump as PumpRow
from backwave.shell.pump import HEALTHY, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.postgres import PostgresStore
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = TaskRegistry(
    [worker_tasks.noop, worker_tasks.flaky, worker_tasks.waits_for_gate_on_first_attempt, worker_tasks.overruns_first_attempt]
)


def _recorder():
    """A task_finished receiver and what it saw: (job id, attempt, status, value, errors, attempt
    rows already written, thread) per signal."""
    seen = []

    def record(sender, task_result, **kwargs):
        written = Attempt.objects.filter(job_id=int(task_result.id)).count()
        seen.append(
            {
                "sender": sender,
                "job": int(task_result.id),
                "attempt": task_result.attempts,
                "status": task_result.status.name,
                "value": task_result.return_value if task_result.status.name == "SUCCESSFUL" else None,
                "errors": [e.exception_class_path for e in task_result.errors],
                "written": written,
                "thread": threading.current_thread().name,
            }
        )

    return seen, record


@pytest.fixture
def received():
    seen, record = _recorder()
    task_finished.connect(record, weak=False)
    yield seen
    task_finished.disconnect(record)


@pytest.fixture
def pump_factory():
    pumps = []

    def start(**overrides):
        options = dict(
            name="signals", policy=Strict("e2e"), pool_size=4, poll_interval=0.05, maintenance_interval=3600, lease_duration=600
        )
        pump = Pump(WorkerGroupOptions(**{**options, **overrides}), 0, store_factory=PostgresStore.from_django, registry=REGISTRY)
        pumps.append(pump)
        pump.start()
        return pump

    yield start
    worker_tasks.GATE.set()
    for pump in pumps:
        pump.drain(timeout=5)
        assert pump.join(10)


def test_one_signal_per_applied_attempt_after_its_outcome_is_written(received, pump_factory):
    (result,) = enqueue_many([(worker_tasks.flaky, (3,), {})])  # fails twice, then succeeds
    pump = pump_factory()
    wait_until(lambda: len(received) == 3, what="three task_finished signals")
    wait_until(lambda: pump.driver.unreported == 0)

    assert Job.objects.get(id=result.id).state == "succeeded"
    assert [(r["attempt"], r["status"], r["errors"]) for r in received] == [
        (1, "FAILED", ["builtins.RuntimeError"]),
        (2, "FAILED", ["builtins.RuntimeError"]),
        (3, "SUCCESSFUL", []),
    ]
    assert received[2]["value"] == {"attempt": 3, "worker_ids": [pump.worker_id] * 3}
    assert {r["sender"] for r in received} == {BackWaveBackend}
    assert [r["written"] for r in received] == [1, 2, 3]  # each sent once its attempt row was there
    assert {r["thread"] for r in received} == {"backwave-pump-signals-0"}


def test_an_attempt_the_worker_ends_at_its_time_limit_is_signalled_once_written(received, pump_factory):
    """The driver ends attempt 1 at its limit and writes it failed while its thread goes on; its
    task_finished comes after that write (the handler's late return sends nothing more), then
    attempt 2's."""
    (result,) = enqueue_many([(worker_tasks.overruns_first_attempt, (), {})])
    pump = pump_factory()
    wait_until(lambda: len(received) == 2, what="two task_finished signals", timeout=30)
    wait_until(lambda: pump.driver.unreported == 0)

    assert Job.objects.get(id=result.id).state == "succeeded"
    assert [(r["attempt"], r["status"]) for r in received] == [(1, "FAILED"), (2, "SUCCESSFUL")]
    assert received[0]["errors"] == [Attempt.objects.get(job_id=result.id, number=1).error_class]
    assert received[0]["written"] == 1
    assert {r["thread"] for r in received} == {"backwave-pump-signals-0"}
    # The first attempt's handler returns at last: its report is no second signal.
    wait_until(lambda: pump.controls.stopped_running() == [], what="the overrunning handler returning", timeout=30)
    wait_until(lambda: pump.driver.unreported == 0)
    assert len(received) == 2


def test_an_outcome_the_fence_refuses_sends_nothing(received, pump_factory):
    worker_tasks.GATE.clear()
    worker_tasks.ENTERED.clear()
    (result,) = enqueue_many([(worker_tasks.waits_for_gate_on_first_attempt, (), {})])
    pump = pump_factory()  # heartbeat every 200 s: the pump does not notice the lease lapse before it writes
    wait_until(lambda: worker_tasks.ENTERED == [int(result.id)], what="the first attempt starting")
    with connection.cursor() as cursor:  # lapsed by the database clock, before the outcome is written
        cursor.execute(
            "UPDATE backwave_lease SET expires_at = now() - interval '1 second' WHERE worker_id = %s", [pump.worker_id]
        )

    worker_tasks.GATE.set()
    wait_until(lambda: pump.driver.stats.lost == 1, what="the fence refusing the outcome")

    assert received == []
    assert Attempt.objects.filter(job_id=result.id).count() == 0
    assert Job.objects.get(id=result.id).state == "running"  # left to lease expiry, as the fence wants


def test_a_raising_receiver_is_logged_and_neither_stops_the_others_nor_the_pump(pump_factory, caplog):
    def explode(sender, task_result, **kwargs):
        raise RuntimeError("a receiver that breaks")

    received, record = _recorder()
    task_finished.connect(explode, weak=False)  # first: the recorder after it must still hear of every outcome
    task_finished.connect(record, weak=False)
    try:
        enqueue_many([(worker_tasks.noop, (n,), {}) for n in range(6)])
        pump = pump_factory()
        wait_until(lambda: Job.objects.filter(state="succeeded").count() == 6, what="six jobs succeeding")
        wait_until(lambda: len(received) == 6, what="six signals reaching the second receiver")
        wait_until(lambda: pump.driver.unreported == 0)
    finally:
        task_finished.disconnect(explode)
        task_finished.disconnect(record)
    assert sorted(r["value"] for r in received) == list(range(6))
    assert pump.health == HEALTHY and pump.alive
    assert PumpRow.objects.get(worker_id=pump.worker_id).status == HEALTHY
    logged = [r for r in caplog.records if r.exc_info and "a receiver that breaks" in str(r.exc_info[1])]
    assert len(logged) == 6  # one per signal, with its traceback


def _django_lines(caplog, job_id: str) -> list:
    """Django's own log_task_finished records for one job ("Task id=... path=... state=...")."""
    return [r for r in caplog.records if r.name == "django.tasks" and r.funcName == "log_task_finished" and r.args[0] == job_id]


def test_djangos_own_failure_line_carries_the_exception_and_its_traceback(pump_factory, caplog):
    """log_task_finished reads sys.exc_info(): Django's backends send task_finished inside the
    handler's except. A failed attempt's line carries the handler's exception and traceback, a
    successful one's none, as with Django's own backends."""
    caplog.set_level("INFO", logger="django.tasks")
    (result,) = enqueue_many([(worker_tasks.flaky, (2,), {})])  # fails once, then succeeds
    pump = pump_factory()
    wait_until(lambda: len(_django_lines(caplog, result.id)) == 2, what="two task_finished lines")
    wait_until(lambda: pump.driver.unreported == 0)

    failed, succeeded = _django_lines(caplog, result.id)
    assert (failed.levelname, succeeded.levelname) == ("ERROR", "INFO")
    assert failed.exc_info is not None and failed.exc_info[0] is RuntimeError
    assert str(failed.exc_info[1]) == "attempt 1 fails on purpose"
    formatted = caplog.handler.formatter.formatException(failed.exc_info)
    assert "in flaky" in formatted and "raise RuntimeError" in formatted
    assert succeeded.exc_info is None


def test_djangos_line_for_an_attempt_ended_at_its_time_limit_names_the_limit(pump_factory, caplog):
    """The driver ended the attempt while its handler ran on: no exception was raised, and the
    line carries the stored error instead."""
    caplog.set_level("INFO", logger="django.tasks")
    (result,) = enqueue_many([(worker_tasks.overruns_first_attempt, (), {})])
    pump = pump_factory()
    wait_until(lambda: len(_django_lines(caplog, result.id)) == 2, what="two task_finished lines", timeout=30)
    failed, _ = _django_lines(caplog, result.id)
    assert failed.levelname == "ERROR"
    assert failed.exc_info is not None
    assert f"{failed.exc_info[0].__module__}.{failed.exc_info[0].__qualname__}" == "backwave.TimeLimitExceeded"
    assert "ran past its time limit" in str(failed.exc_info[1])
    wait_until(lambda: pump.controls.stopped_running() == [], what="the overrunning handler returning", timeout=30)

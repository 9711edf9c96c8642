"""A pump that starts while the database cannot be reached: degraded, it retries with backoff,
then works; asked to drain meanwhile, it stops without ever having held anything."""

from __future__ import annotations

import time

import pytest

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job, Pump as PumpRow
from backwave.shell.pump import DEGRADED, HEALTHY, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.contract import TransientStoreError
from backwave.store.postgres import PostgresStore
from tests.shell import worker_tasks

pytestmark = pytest.mark.django_db(transaction=True)

OPTIONS = WorkerGroupOptions(
    name="start", policy=Strict("e2e"), pool_size=2, poll_interval=0.05, maintenance_interval=3600, lease_duration=30
)


def wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


class Unreachable:
    """A store factory that fails like a database that is still starting, ``failures`` times."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientStoreError("cannot connect to PostgreSQL: connection refused")
        return PostgresStore.from_django()


def test_a_pump_started_before_the_database_answers_waits_degraded_then_works():
    job = worker_tasks.noop.enqueue(3)
    factory = Unreachable(failures=3)
    pump = Pump(OPTIONS, 0, store_factory=factory, registry=TaskRegistry([worker_tasks.noop]))
    seen = []
    pump.start()
    try:
        wait_until(lambda: seen.append(pump.health) or Job.objects.get(id=job.id).state == "succeeded")
        assert DEGRADED in seen and pump.health == HEALTHY
        assert factory.calls == 4
        assert PumpRow.objects.get(worker_id=pump.worker_id).status == HEALTHY
    finally:
        pump.drain(timeout=5)
        assert pump.join(10)
    assert not PumpRow.objects.filter(worker_id=pump.worker_id).exists(), "a clean stop deletes the health row"


def test_a_pump_asked_to_drain_before_the_database_ever_answered_just_stops():
    factory = Unreachable(failures=10**6)
    pump = Pump(OPTIONS, 0, store_factory=factory, registry=TaskRegistry([]))
    pump.start()
    wait_until(lambda: factory.calls >= 2)
    assert pump.health == DEGRADED and "connection refused" in pump.health_reason
    pump.drain(timeout=5)
    assert pump.join(10)

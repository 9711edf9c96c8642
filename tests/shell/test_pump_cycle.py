"""One pump, in-process, against the real store: pin the statements of a claim -> execute ->
report cycle so a per-job round-trip can never creep in."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Attempt, Job, Lease
from backwave.shell.pump import HEALTHY, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.postgres import PostgresStore
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingStore:
    """Passes every call to a real PostgresStore and records (method, size) pairs."""

    def __init__(self):
        self.inner = PostgresStore.from_django()
        self.calls: list[tuple[str, int]] = []

    @property
    def round_trips(self):
        return self.inner.round_trips

    def __getattr__(self, name):
        method = getattr(self.inner, name)
        if not callable(method):
            return method

        def record(*args, **kwargs):
            result = method(*args, **kwargs)
            size = len(kwargs.get("outcomes", ())) if "outcomes" in kwargs else kwargs.get("limit", 0)
            self.calls.append((name, size))
            return result

        return record


def _wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def test_a_batch_of_32_costs_two_round_trips():
    # Fresh statistics, so that the maintenance run's check finds nothing to analyze (earlier
    # tests changed these tables by thousands of rows): one round-trip, not two.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backwave_job, backwave_attempt, backwave_dependency, backwave_transition")
    enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(32)])
    store = RecordingStore()
    options = WorkerGroupOptions(
        name="cycle",
        policy=Strict("e2e"),
        pool_size=32,
        max_claim_batch=32,
        poll_interval=3600,
        maintenance_interval=3600,
        lease_duration=600,
    )
    pump = Pump(options, 0, store_factory=lambda: store, registry=TaskRegistry([worker_tasks.noop]))
    pump.start()
    try:
        _wait_until(lambda: Attempt.objects.count() == 32)
        _wait_until(lambda: pump.driver.unreported == 0 and pump.driver.idle)
    finally:
        pump.drain(timeout=5)
        assert pump.join(10)
    assert pump.health == HEALTHY
    assert Job.objects.filter(state="succeeded").count() == 32
    assert Lease.objects.count() == 0
    assert store.calls == [
        ("open_lease", 0),
        ("record_pumps_many", 0),  # health: the pump is up (then at each heartbeat, never per job)
        ("claim_jobs", 32),  # the first poll: all 32 jobs in one statement
        # maintenance once at start-up, each step one bounded statement:
        ("expire_leases", 1000),
        ("due_schedules", 100),  # no schedule is due, so nothing to mint
        ("roll_up_task_stats", 5000),  # the statistics, before the purge that waits for them
        ("refresh_statistics", 0),  # the planner's statistics are fresh: the check alone
        ("purge_jobs", 1000),
        ("purge_pumps", 0),
        ("purge_task_stats", 10000),  # statistics buckets past retention, one bounded statement
        ("write_outcomes_then_claim", 32),  # all 32 outcomes, and the re-poll riding the write
        ("release_lease", 0),  # the drain
        ("forget_pumps_many", 0),  # a clean stop leaves no health row behind
        ("close", 0),
    ]
    # The 32 jobs themselves cost two round-trips: the claim and the pipelined write+claim. The
    # rest is start-up (open, health, seven maintenance steps) and the drain (release, forget).
    assert store.round_trips == 13


class FirstWriteWaitsForTheRest(RecordingStore):
    """The first outcome write lets the other jobs finish, then waits until their reports are
    posted to the pump before it runs: they finished while the write was in flight."""

    def __init__(self, others: int, posted: list[int]):
        super().__init__()
        self.others = others
        self.posted = posted  # the jobs whose reports reached the pump, the first one's included
        self.first = True

    def __getattr__(self, name):
        method = super().__getattr__(name)
        if not name.startswith("write_outcomes"):
            return method

        def write(*args, **kwargs):
            if self.first:
                self.first = False
                worker_tasks.REST_MAY_FINISH.set()
                _wait_until(lambda: len(self.posted) >= 1 + self.others)
            return method(*args, **kwargs)

        return write


@pytest.fixture
def posted(monkeypatch) -> list[int]:
    """The ids of the jobs whose reports the pump's threads have posted to it, in order."""
    posted: list[int] = []
    post = Pump._finished

    def counted(self, job, report):
        post(self, job, report)
        posted.append(job.id)

    monkeypatch.setattr(Pump, "_finished", counted)
    return posted


def test_the_reports_that_came_in_during_a_write_ride_the_next_one_together(posted):
    """With no linger every outcome is due at once, so the first finished job's is written
    alone. The three jobs that finish meanwhile must then go out in one write: fed to the driver
    behind the write's answer instead, each found the write just decided and had a round-trip
    of its own (sleeping jobs wrote 1.0 round-trips
    a job with no linger)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backwave_job, backwave_attempt, backwave_dependency, backwave_transition")
    worker_tasks.REST_MAY_FINISH.clear()
    enqueue_many([(worker_tasks.first_returns_the_rest_wait, (n,), {}) for n in range(4)])
    store = FirstWriteWaitsForTheRest(others=3, posted=posted)
    options = WorkerGroupOptions(
        name="cycle",
        policy=Strict("e2e"),
        pool_size=4,
        max_claim_batch=4,
        outcome_linger=0.0,
        poll_interval=3600,
        maintenance_interval=3600,
        lease_duration=600,
    )
    pump = Pump(options, 0, store_factory=lambda: store, registry=TaskRegistry([worker_tasks.first_returns_the_rest_wait]))
    pump.start()
    try:
        _wait_until(lambda: Attempt.objects.count() == 4)
        _wait_until(lambda: pump.driver.unreported == 0 and pump.driver.idle)
    finally:
        worker_tasks.REST_MAY_FINISH.set()
        pump.drain(timeout=5)
        assert pump.join(10)
    assert pump.health == HEALTHY
    assert Job.objects.filter(state="succeeded").count() == 4
    assert [size for name, size in store.calls if name.startswith("write_outcomes")] == [1, 3], store.calls

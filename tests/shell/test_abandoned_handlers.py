"""A handler that outlives its pump's lease still holds its thread: one real pump, in-process, on
PostgreSQL. After the lease is lost the pump claims again, but only for threads it has: every job
it claims starts at once, none waits in the pool's queue behind the abandoned handler."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.shell.pump import HALTED, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.postgres import PostgresStore
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class LeaseWatchingStore:
    """A real PostgresStore that records the leases opened, renewals landed and jobs claimed."""

    def __init__(self):
        self.inner = PostgresStore.from_django()
        self.lock = threading.Lock()
        self.leases: list = []
        self.renewed: list = []  # lease ids of renewals that landed, in order
        self.claimed: list[tuple[int, int]] = []  # (job id, attempt)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def open_lease(self, *, lease_id, **kwargs):
        self.inner.open_lease(lease_id=lease_id, **kwargs)
        with self.lock:
            self.leases.append(lease_id)

    def heartbeat(self, *, lease_id, duration, progress=()):
        beat = self.inner.heartbeat(lease_id=lease_id, duration=duration, progress=progress)
        if beat.held:
            with self.lock:
                self.renewed.append(lease_id)
        return beat

    def claim_jobs(self, **kwargs):
        jobs = self.inner.claim_jobs(**kwargs)
        with self.lock:
            self.claimed += [(job.id, job.attempt) for job in jobs]
        return jobs

    def write_outcomes_then_claim(self, **kwargs):
        applied, jobs = self.inner.write_outcomes_then_claim(**kwargs)
        with self.lock:
            self.claimed += [(job.id, job.attempt) for job in jobs]
        return applied, jobs


def expire_the_lease_of(pump: Pump) -> int:
    """What maintenance on another node does once a lease lapsed: its jobs are ready again."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE backwave_lease SET expires_at = now() - interval '1 second' WHERE worker_id = %s", [pump.worker_id]
        )
    with PostgresStore.from_django() as store:
        return store.expire_leases(limit=10)


@pytest.fixture
def handlers():
    worker_tasks.STARTED.clear()
    worker_tasks.RELEASE.clear()
    yield worker_tasks
    worker_tasks.RELEASE.set()  # never leave a thread blocked behind the test


def test_after_a_lease_loss_a_job_is_claimed_only_when_a_thread_is_free_for_it(handlers):
    hung = int(enqueue_many([(handlers.hangs_until_released, (), {})])[0].id)
    store = LeaseWatchingStore()
    options = WorkerGroupOptions(
        name="abandon",
        policy=Strict("e2e"),
        pool_size=1,
        poll_interval=0.05,
        lease_duration=2.0,
        maintenance_interval=3600,
        drain_timeout=5,
    )
    registry = TaskRegistry([handlers.hangs_until_released, handlers.records_start])
    pump = Pump(options, 0, store_factory=lambda: store, registry=registry)
    pump.start()
    try:
        wait_until(lambda: handlers.STARTED == [(hung, 1)], "the hung handler starting")
        assert expire_the_lease_of(pump) == 1  # the hung job is ready again, its handler runs on
        later = int(enqueue_many([(handlers.records_start, (), {})])[0].id)
        wait_until(lambda: len(store.leases) == 2, "the pump opening a new lease after losing its first")
        new_lease = store.leases[1]
        # Two heartbeats under the new lease: the pump has polled many times since it opened it.
        wait_until(lambda: store.renewed.count(new_lease) >= 2, "two renewals of the new lease")
        with store.lock:
            claimed = list(store.claimed)
        unstarted = [attempt for attempt in claimed if attempt not in handlers.STARTED]
        assert unstarted == [], f"claimed but never started (waiting behind the hung handler): {unstarted}"
        assert list(Job.objects.filter(state="running").values_list("id", flat=True)) == []

        handlers.RELEASE.set()  # the abandoned handler returns, and its thread is free again
        wait_until(
            lambda: set(Job.objects.filter(id__in=[hung, later]).values_list("state", flat=True)) == {"succeeded"},
            "both jobs done once the thread was free",
        )
        assert pump.health != HALTED, pump.health_reason
        with store.lock:
            claimed = list(store.claimed)
        assert sorted(claimed) == sorted(handlers.STARTED)  # every job claimed started, once
        assert (hung, 2) in claimed and (later, 1) in claimed
    finally:
        handlers.RELEASE.set()
        pump.drain(timeout=5)
        assert pump.join(10)


def test_the_pool_refuses_a_job_it_has_no_thread_for_instead_of_queueing_it():
    """The driver's guarantee, checked where it matters: a job that would wait in the pool's
    queue is refused (the pump halts on it, and its lease lapses) rather than left unstarted."""
    from backwave.shell.pump import PoolExhausted, WorkerPool

    release, done = threading.Event(), []

    class Job:
        def __init__(self, id):
            self.id = id

    def run(job):
        if job.id == 1:
            release.wait(30)
        return f"report {job.id}"

    pool = WorkerPool(1, run, lambda job, report: done.append(report), name="test-pool")
    try:
        pool.submit(Job(1))
        with pytest.raises(PoolExhausted, match="job 2 was handed to a pool whose 1 thread"):
            pool.submit(Job(2))
        release.set()
        wait_until(lambda: done == ["report 1"], "the first job reporting")
        pool.submit(Job(3))  # the report came after the thread was free again
        wait_until(lambda: done == ["report 1", "report 3"], "the third job reporting")
    finally:
        release.set()
        pool.shutdown()


def test_the_pool_starts_its_threads_with_its_first_job():
    """Not when the pump is built: 64 threads started before the pump thread cost 6-9 ms of a
    worker's start to its first claim on a quiet machine, 45-140 ms beside a busy core."""
    from backwave.shell.pump import WorkerPool

    class Job:
        def __init__(self, id):
            self.id = id

    done = []
    before = {t.name for t in threading.enumerate()}
    pool = WorkerPool(3, lambda job: job.id, lambda job, report: done.append(report), name="lazy-pool")
    try:
        started = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith("lazy-pool") and t.name not in before)  # noqa: E731
        assert started() == []
        for n in range(1, 6):
            pool.submit(Job(n))
            wait_until(lambda: len(done) == n, f"job {n} reporting")
        assert started() == ["lazy-pool_0", "lazy-pool_1", "lazy-pool_2"]
    finally:
        pool.shutdown()

"""A long-lived pump keeps nothing of an attempt once that attempt is settled or given up: its
report leaves with its outcome, however the outcome ends (written, refused, dropped with a lost
lease, or never wanted because the attempt was abandoned). A real Pump, the real PostgreSQL."""

from __future__ import annotations

import gc

import pytest
from django.db import connection

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.shell.execution import AttemptReport
from backwave.shell.pump import HEALTHY, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.postgres import PostgresStore
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 3
JOBS_PER_ROUND = 4


def _reports_alive(job_ids) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, AttemptReport) and o.job_id in job_ids)


def test_reports_of_attempts_abandoned_with_a_lost_lease_are_not_kept():
    options = WorkerGroupOptions(
        name="memory",
        policy=Strict("e2e"),
        pool_size=JOBS_PER_ROUND,
        poll_interval=0.05,
        maintenance_interval=0.2,
        lease_duration=3,
    )
    pump = Pump(
        options, 0, store_factory=PostgresStore.from_django, registry=TaskRegistry([worker_tasks.waits_for_gate_on_first_attempt])
    )
    pump.start()
    job_ids: set[int] = set()
    try:
        for round_number in range(1, ROUNDS + 1):
            worker_tasks.GATE.clear()
            worker_tasks.ENTERED.clear()
            results = enqueue_many([(worker_tasks.waits_for_gate_on_first_attempt, (), {})] * JOBS_PER_ROUND)
            ids = {int(r.id) for r in results}
            job_ids |= ids
            wait_until(lambda: set(worker_tasks.ENTERED) == ids, what=f"round {round_number}: every first attempt running")
            # Expired by the database clock: the next heartbeat finds the lease gone and the pump
            # gives those attempts up while their handlers are still running.
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE backwave_lease SET expires_at = now() - interval '1 second' WHERE worker_id = %s", [pump.worker_id]
                )
            wait_until(
                lambda: pump.driver.stats.abandoned == round_number * JOBS_PER_ROUND, what=f"round {round_number}: the lease loss"
            )
            worker_tasks.GATE.set()  # the abandoned handlers finish now, after the loss
            # The second attempts (after expiry made the jobs ready again) run on and succeed.
            wait_until(
                lambda: Job.objects.filter(id__in=ids, state="succeeded").count() == JOBS_PER_ROUND,
                what=f"round {round_number}: the re-runs",
            )
        wait_until(lambda: pump.driver.unreported == 0, what="every outcome written")
        assert pump.health == HEALTHY
        try:
            wait_until(lambda: _reports_alive(job_ids) == 0, timeout=10, what="the reports being let go")
        except AssertionError:
            raise AssertionError(
                f"{_reports_alive(job_ids)} attempt report(s) of {len(job_ids)} settled jobs are still held"
            ) from None
    finally:
        worker_tasks.GATE.set()
        pump.drain(timeout=5)
        assert pump.join(10)

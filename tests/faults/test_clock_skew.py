"""Fault test 8: workers whose wall clocks are three days fast and three days slow (a test hook
moves time.time and Django's timezone.now in their processes; the pump's own timers use the
monotonic clock). Leases, their expiry, retries, retention and schedules behave exactly as with
true clocks, because every timestamp that matters is the database's now()."""

from __future__ import annotations

import signal
import uuid
from datetime import timedelta

import pytest

from backwave.models import Attempt, Job, Lease
from backwave.store.postgres import PostgresStore
from tests.faults import tasks

from .conftest import FAST, faults_env, sql, wait_until, worker_prefix

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

THREE_DAYS = 3 * 86_400


def db_now():
    return sql("SELECT now()")[0][0]


def test_8_a_skewed_worker_clock_changes_nothing(start_worker):
    # A job that finished two hours ago: inside the one-day retention by the database clock, three
    # days past it by the fast worker's clock.
    kept = Job.objects.create(
        task_path=tasks.work.module_path, queue="faults-done", payload={"args": [], "kwargs": {}}, state="succeeded"
    )
    sql("UPDATE backwave_job SET finished_at = now() - interval '2 hours' WHERE id = %s", [kept.id])
    retried = tasks.fails_once.enqueue()
    # A lease of another node, live for 10 more seconds by the database clock, with a running job.
    foreign = uuid.uuid4()
    with PostgresStore.from_django() as store:
        store.open_lease(lease_id=foreign, worker_id="other:1:g:0:x", group="g", hostname="other", pid=1, duration=10)
        parked = Job.objects.create(
            task_path=tasks.work.module_path, queue="faults-parked", payload={"args": [], "kwargs": {}}, max_attempts=3
        )
        store.claim_jobs(lease_id=foreign, worker_id="other:1:g:0:x", queues=["faults-parked"], limit=1)
    foreign_expires = Lease.objects.get(id=foreign).expires_at

    schedules = {"every-second": {"task": tasks.work.module_path, "cron": "* * * * * *"}}
    args = ("--queues", "faults", "--pool-size", "2", "--lease-duration", "3", *FAST)
    fast = start_worker(*args, env=faults_env(clock_skew=THREE_DAYS, schedules=schedules))
    slow = start_worker(*args, env=faults_env(clock_skew=-THREE_DAYS, schedules=schedules))
    workers = [fast, slow]

    # Schedules: slots by the database clock, each once, not three days off.
    wait_until(
        lambda: Job.objects.filter(schedule__isnull=False, state="succeeded").count() >= 3,
        what="three slots minted and run",
        workers=workers,
    )
    now = db_now()
    slots = list(Job.objects.filter(schedule__isnull=False).values_list("schedule_slot", flat=True))
    assert len(slots) == len(set(slots))
    assert all(now - timedelta(seconds=30) < slot <= now for slot in slots), (now, slots)

    # Leases: stamped by the database's now (not three days off), lease_duration apart.
    for worker in workers:
        wait_until(
            lambda: Lease.objects.filter(worker_id__startswith=worker_prefix(worker)).exists(),
            what="the worker's lease",
            workers=workers,
        )
        (renewed_at, expires_at) = Lease.objects.filter(worker_id__startswith=worker_prefix(worker)).values_list(
            "renewed_at", "expires_at"
        )[0]
        assert expires_at - renewed_at == timedelta(seconds=3)
        assert abs(db_now() - renewed_at) < timedelta(minutes=1)

    # Retries: due after their backoff by the database clock (the fast worker would otherwise
    # have put the retry three days out).
    wait_until(lambda: Job.objects.get(id=retried.id).state == "succeeded", what="the retry running", workers=workers)
    assert Job.objects.get(id=retried.id).attempts == 2

    # Expiry: the foreign lease is expired once it lapses by the database clock: not at once by
    # the fast worker, not three days late by the slow one.
    if db_now() < foreign_expires - timedelta(seconds=1):
        assert Lease.objects.filter(id=foreign).exists(), "expired before its time"
    wait_until(lambda: not Lease.objects.filter(id=foreign).exists(), what="the foreign lease expiring", workers=workers)
    (lapsed,) = Attempt.objects.filter(job=parked)
    assert lapsed.state == "lapsed" and lapsed.finished_at >= foreign_expires

    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output
    # Retention: the job that finished two hours ago is still there.
    assert Job.objects.filter(id=kept.id).exists()

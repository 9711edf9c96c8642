"""Maintenance racing the work it maintains, and itself.

Fault tests 3 (a job finishing while its lease is being expired is not resurrected) and 7 (many
maintenance runs at the same moment release each lapsed lease once and mint each slot once)."""

from __future__ import annotations

import re
import signal
import threading
import uuid

import psycopg
import pytest
from django.db import connection

from backwave.core.jobs import OutcomeKind
from backwave.models import Attempt, Job, Lease, Schedule
from backwave.store.contract import OutcomeRecord
from backwave.store.params import outcome_params
from backwave.store.postgres import PostgresStore, django_conninfo
from backwave.store.queries import QUERIES
from tests.faults import tasks

from .conftest import FAST, faults_env, history, sql, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def running_job_under_a_lease(*, duration: float) -> tuple[uuid.UUID, int]:
    """A job claimed under a fresh lease (on a queue of its own, which no worker serves)."""
    queue = f"parked-{uuid.uuid4().hex[:8]}"
    with PostgresStore.from_django() as store:
        lease_id = uuid.uuid4()
        store.open_lease(
            lease_id=lease_id, worker_id="elsewhere:1:g:0:x", group="g", hostname="elsewhere", pid=1, duration=duration
        )
        job = Job.objects.create(
            task_path=tasks.work.module_path, queue=queue, payload={"args": [], "kwargs": {}}, max_attempts=3
        )
        (claimed,) = store.claim_jobs(lease_id=lease_id, worker_id="elsewhere:1:g:0:x", queues=[queue], limit=1)
        assert claimed.id == job.id
    return lease_id, job.id


def lapse(lease_id: uuid.UUID) -> None:
    sql("UPDATE backwave_lease SET expires_at = now() - interval '1 second' WHERE id = %s", [lease_id])


def raw_connection() -> psycopg.Connection:
    """A session of the test's own, outside Django, with an explicit transaction."""
    return psycopg.connect(**django_conninfo(connection.settings_dict), autocommit=False)


def maintenance_blocked_on_a_row_lock() -> bool:
    rows = sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'backwave' "
        "AND wait_event_type = 'Lock' AND query LIKE %s",
        ["%backwave_lease%expires_at < now()%"],
    )
    return rows[0][0] > 0


def test_3_a_job_finishing_while_its_lease_is_expired_is_not_resurrected(start_worker):
    """Two orderings, each with a real worker running maintenance every 0.1 s:

    (a) a fenced outcome write is in flight (holding its lease row) when the lease lapses:
        expiry skips that lease while the write holds it; the write commits the outcome, and the
        next expiry deletes the lease and finds nothing running under it;
    (b) the job row expiry is about to release is locked by a transaction that finishes the job:
        expiry does not wait for it (nor for any row another transaction holds), it keeps the
        lease, lapsed; once the finish commits, the next expiry finds nothing running under it,
        deletes the lease and leaves the finished job alone."""
    maintainer = start_worker("--queues", "faults", *FAST)
    wait_until(lambda: "BackWave worker started" in maintainer.output, what="the maintainer starting", workers=[maintainer])

    # (a) The outcome write holds its lease row FOR KEY SHARE while it is open.
    lease_a, job_a = running_job_under_a_lease(duration=60)
    canary, canary_job = running_job_under_a_lease(duration=60)
    write = raw_connection()
    outcome = OutcomeRecord(job_id=job_a, attempt=1, kind=OutcomeKind.SUCCEEDED, return_value="done")
    applied = write.execute(QUERIES["write_outcomes_many"], outcome_params(lease_a, [outcome])).fetchall()
    assert applied == [(job_a, 0, False)]  # (job id, dependents released, busy)
    lapse(lease_a)  # the lease lapses while the write is still open
    lapse(canary)  # a lapsed lease nobody holds: proof that maintenance runs meanwhile
    wait_until(
        lambda: not Lease.objects.filter(id=canary).exists(), what="maintenance expiring the canary lease", workers=[maintainer]
    )
    assert Lease.objects.filter(id=lease_a).exists(), "expiry must skip a lease whose write is in flight"
    write.commit()
    write.close()
    wait_until(
        lambda: not Lease.objects.filter(id=lease_a).exists(),
        what="the lapsed lease being expired after the write",
        workers=[maintainer],
    )
    assert (Job.objects.get(id=job_a).state, Job.objects.get(id=job_a).return_value) == ("succeeded", "done")
    assert list(Attempt.objects.filter(job_id=job_a).values_list("state", flat=True)) == ["succeeded"]
    assert list(Attempt.objects.filter(job_id=canary_job).values_list("state", flat=True)) == ["lapsed"]

    # (b) The job row is locked by its completion when expiry reaches it.
    lease_b, job_b = running_job_under_a_lease(duration=60)
    completion = raw_connection()
    completion.execute(
        "UPDATE backwave_job SET state = 'succeeded', lease_id = NULL, finished_at = now(), return_value = '\"finished\"' WHERE id = %s",
        [job_b],
    )
    canary_b, _ = running_job_under_a_lease(duration=60)
    lapse(lease_b)
    lapse(canary_b)
    wait_until(
        lambda: not Lease.objects.filter(id=canary_b).exists(), what="maintenance expiring the canary lease", workers=[maintainer]
    )
    assert Lease.objects.filter(id=lease_b).exists(), "expiry must keep a lease whose job row another transaction holds"
    assert not maintenance_blocked_on_a_row_lock(), "expiry never waits for a job row"
    completion.commit()
    completion.close()
    wait_until(lambda: not Lease.objects.filter(id=lease_b).exists(), what="expiry finishing", workers=[maintainer])
    job = Job.objects.get(id=job_b)
    assert (job.state, job.lease_id, job.return_value) == ("succeeded", None, "finished")
    assert not Attempt.objects.filter(job_id=job_b).exists(), "no 'lapsed' attempt for a job that finished"

    maintainer.signal(signal.SIGTERM)
    assert maintainer.wait() == 0, maintainer.output


def test_7_concurrent_maintenance_releases_each_lapsed_lease_and_mints_each_slot_once(start_worker):
    """60 leases (120 running jobs) lapse in two waves: the first under eight expiry runs of the
    test released at one instant by a barrier, the second under three worker processes (two pumps
    each, maintenance every 0.05 s) that also mint 8 schedules due every second. Each lapsed lease
    is expired once (one 'lapsed' attempt per job; the released counts of every thread and log add
    up to the number of jobs), and each schedule slot becomes one job (the minted counts of every
    log add up to the jobs minted, and no (schedule, slot) repeats)."""
    leases = []
    with PostgresStore.from_django() as store:
        for n in range(60):
            lease_id = uuid.uuid4()
            store.open_lease(lease_id=lease_id, worker_id=f"gone:{n}:g:0:x", group="g", hostname="gone", pid=n, duration=60)
            Job.objects.bulk_create(
                [
                    Job(task_path=tasks.work.module_path, queue="faults", payload={"args": [], "kwargs": {}}, max_attempts=3)
                    for _ in range(2)
                ]
            )
            assert len(store.claim_jobs(lease_id=lease_id, worker_id=f"gone:{n}:g:0:x", queues=["faults"], limit=2)) == 2
            leases.append(lease_id)
    schedules = {f"every-second-{i}": {"task": tasks.work.module_path, "cron": "* * * * * *"} for i in range(8)}
    env = faults_env(schedules=schedules)
    # The leases under test are the 60 above, lapsed by hand; the workers' own keep the default
    # (conftest.FAST says why).
    args = ("--queues", "faults", "--pumps", "2", "--pool-size", "4", "--poll-interval", "0.05", "--maintenance-interval", "0.05")

    stores = [PostgresStore.from_django() for _ in range(8)]
    barrier = threading.Barrier(len(stores) + 1)
    released_by_threads: list[int] = []

    def expire(store):
        barrier.wait(timeout=60)
        released_by_threads.append(store.expire_leases(limit=1000))

    threads = [threading.Thread(target=expire, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    first, second = leases[:30], leases[30:]
    sql("UPDATE backwave_lease SET expires_at = now() - interval '1 second' WHERE id = ANY(%s)", [first])
    barrier.wait(timeout=60)
    for thread in threads:
        thread.join(60)
    for store in stores:
        store.close()
    assert sum(released_by_threads) == 60

    workers = [start_worker(*args, env=env) for _ in range(3)]
    for worker in workers:
        wait_until(lambda: "BackWave worker started" in worker.output, what="the workers starting", workers=workers)
    sql("UPDATE backwave_lease SET expires_at = now() - interval '1 second' WHERE id = ANY(%s)", [second])

    # Every released job runs (a 'work' job is instant), and slots keep coming for a while.
    wait_until(
        lambda: Job.objects.filter(schedule__isnull=True, state="succeeded").count() == 120,
        what="every released job running",
        workers=workers,
    )
    wait_until(
        lambda: Job.objects.filter(schedule__isnull=False).count() >= 8 * 3, what="three slots of each schedule", workers=workers
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output

    assert not Lease.objects.filter(id__in=leases).exists()
    log = history()
    released_jobs = Job.objects.filter(schedule__isnull=True)
    for job_id in released_jobs.values_list("id", flat=True):
        assert [state for state, _ in log[job_id]] == ["lapsed", "succeeded"], (log[job_id], [w.output for w in workers])
    logged = sum(int(n) for w in workers for n in re.findall(r"Released (\d+) job\(s\) from lapsed leases", w.output))
    assert sum(released_by_threads) + logged == 120

    minted = Job.objects.filter(schedule__isnull=False)
    assert (
        sql("SELECT schedule_id, schedule_slot FROM backwave_job WHERE schedule_id IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1")
        == []
    )
    minted_logged = sum(int(n) for w in workers for n in re.findall(r"Minted (\d+) job\(s\) from schedules", w.output))
    assert minted_logged == minted.count()
    assert Schedule.objects.count() == 8
    for schedule in Schedule.objects.all():
        slots = sorted(minted.filter(schedule=schedule).values_list("schedule_slot", flat=True))
        assert slots and slots[-1] == schedule.last_slot
        assert all(slot.microsecond == 0 for slot in slots)

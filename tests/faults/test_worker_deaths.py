"""Workers that die, stall or kill themselves: no job lost, no late write lands, no crash loop.

Fault tests 1 (kill -9 with a full claim batch), 2 (the zombie write), 6 (a job that
os._exit()s its worker on every attempt) and 7 (the same crasher claimed in one batch with others,
at the default pool size)."""

from __future__ import annotations

import re
import signal

import pytest

from backwave.models import Attempt, Job, Lease
from backwave.tasking.task import enqueue_many
from tests.faults import tasks
from tests.shell import worker_tasks

from .conftest import FAST, faults_env, history, snapshot, states, wait_until, worker_prefix

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def refused(output: str) -> int:
    return sum(int(n) for n in re.findall(r"the lease fence refused (\d+) of \d+ outcome", output))


def test_1_a_worker_killed_holding_a_full_batch_loses_nothing(start_worker):
    """kill -9 a worker whose pool is full of claimed jobs: once its lease lapses, a second worker
    runs every one of them; each job ends with exactly one terminal outcome."""
    # First attempts hang (until the kill); the rescuer's second attempts are instant.
    results = enqueue_many([(tasks.slow_first_attempt, (60,), {}) for _ in range(8)])
    ids = {int(r.id) for r in results}
    doomed = start_worker("--queues", "faults", "--pool-size", "8", "--max-claim-batch", "8", "--lease-duration", "1.5", *FAST)
    wait_until(
        lambda: Job.objects.filter(state="running").count() == 8,
        what="the first worker holding a full batch of 8",
        workers=[doomed],
    )
    assert set(Job.objects.filter(state="running").values_list("id", flat=True)) == ids
    doomed.process.kill()
    doomed.wait()

    rescuer = start_worker("--queues", "faults", "--pool-size", "8", *FAST)
    wait_until(lambda: states() == {"succeeded": 8}, what="every job succeeding on the second worker", workers=[rescuer])
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0, rescuer.output

    log = history()
    assert set(log) == ids
    for job_id in ids:
        (lapsed, lapsed_by), (done, done_by) = log[job_id]
        assert (lapsed, done) == ("lapsed", "succeeded")
        assert lapsed_by.startswith(worker_prefix(doomed)) and done_by.startswith(worker_prefix(rescuer))
    assert list(Job.objects.values_list("attempts", "return_value").distinct()) == [(2, 2)]
    assert "Released 8 job(s) from lapsed leases" in rescuer.output
    assert Lease.objects.count() == 0


@pytest.mark.parametrize(
    "stall",
    [
        pytest.param("sigstop", id="SIGSTOP: the pump fences itself"),
        pytest.param("blocked-heartbeat", id="blocked heartbeat, self-fence off: the store fences"),
    ],
)
def test_2_a_zombie_writes_late_and_changes_nothing(start_worker, stall):
    """Stall a worker past its lease; another worker re-claims and finishes its jobs; then the
    stalled one goes on. Its late outcomes change nothing: attempts, errors and outcomes stay as
    the second worker left them.

    With SIGSTOP the whole process freezes and, woken, the driver sees that no heartbeat landed
    within the lease and drops its outcomes (the self-fence). With its heartbeat blocked and the
    self-fence switched off (a test hook), the process runs on and really sends the late write:
    the store's lease fence is what refuses it."""
    results = enqueue_many([(tasks.outlived, (), {}) for _ in range(4)])
    env = faults_env(trust_lease_for_ever=True, no_heartbeat=True) if stall == "blocked-heartbeat" else None
    zombie = start_worker("--queues", "faults", "--pool-size", "4", "--lease-duration", "1", *FAST, env=env)
    wait_until(
        lambda: Job.objects.filter(state="running").count() == 4, what="the first worker running all four", workers=[zombie]
    )
    if stall == "sigstop":
        zombie.signal(signal.SIGSTOP)

    rescuer = start_worker("--queues", "faults", "--pool-size", "4", *FAST)
    wait_until(lambda: states() == {"succeeded": 4}, what="the second worker finishing every job", workers=[zombie, rescuer])
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0, rescuer.output
    settled = snapshot()

    if stall == "sigstop":
        zombie.signal(signal.SIGCONT)
        wait_until(lambda: "gave up its lease" in zombie.output, what="the zombie giving its lease up", workers=[zombie])
        # It carries on with a new lease, as a healthy pump.
        wait_until(
            lambda: Lease.objects.filter(worker_id__startswith=worker_prefix(zombie)).exists(),
            what="the zombie opening a new lease",
            workers=[zombie],
        )
    else:
        # Written in one batch or several, as the handlers finish: four refused in all.
        wait_until(lambda: refused(zombie.output) == 4, what="the late writes being refused", workers=[zombie])
    zombie.signal(signal.SIGTERM)
    assert zombie.wait() == 0, zombie.output

    assert snapshot() == settled
    for result in results:
        job = Job.objects.get(id=result.id)
        assert (job.state, job.attempts, job.return_value) == ("succeeded", 2, "second")
        assert list(Attempt.objects.filter(job=job).values_list("state", flat=True)) == ["lapsed", "succeeded"]


def test_6_a_job_that_kills_its_worker_every_time_fails_after_max_attempts(start_worker):
    """os._exit() on every attempt: the first lapse is forgiven (the job could have been a bystander
    of another job's crash) and makes it a suspect; from then on each try costs an attempt, so
    after max_attempts counted attempts the lapsed lease fails the job instead of handing it out
    again."""
    doomed = worker_tasks.exits_process.enqueue()
    args = ("--queues", "e2e", "--pool-size", "1", "--lease-duration", "1", *FAST)
    deaths = 0
    survivor = None
    for _ in range(5):
        worker = start_worker(*args)
        wait_until(
            lambda: worker.process.poll() is not None or Job.objects.get(id=doomed.id).state == "failed",
            what="the worker dying or the job failing for good",
            workers=[worker],
        )
        if worker.process.poll() is None:
            survivor = worker
            break
        assert worker.process.returncode == 3, worker.output
        deaths += 1
    assert deaths == 3, "one forgiven death, then one per attempt, max_attempts = 2"
    assert survivor is not None

    # The survivor is not in a crash loop: it goes on running ordinary work.
    after = worker_tasks.noop.enqueue(5)
    wait_until(
        lambda: Job.objects.get(id=after.id).state == "succeeded", what="the survivor running the next job", workers=[survivor]
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output

    job = Job.objects.get(id=doomed.id)
    assert (job.state, job.attempts, job.forgiven_attempts) == ("failed", 3, 1)
    attempts = list(Attempt.objects.filter(job=job).values_list("state", "error_class"))
    assert attempts == [("lapsed", "backwave.results.LeaseLapsed")] * 3
    assert "not counted" in Attempt.objects.filter(job=job).first().traceback
    assert "no attempts left, the job failed" in Attempt.objects.filter(job=job).last().traceback


def test_7_a_crashing_job_costs_the_jobs_claimed_with_it_nothing(start_worker):
    """One job os._exit()s its worker on every attempt; ten others were claimed in the same batch
    (the default pool of 20 takes all eleven at once) and die with it the first time. The test
    restarts the worker after each death, as a supervisor would. Only the crasher pays: it fails
    once its attempts are used up, and each of the ten succeeds, its attempt killed beside the
    crasher not counted."""
    results = enqueue_many(
        [(tasks.work, (0.5,), {}) for _ in range(5)]
        + [(tasks.kills_its_worker, (), {})]
        + [(tasks.work, (0.5,), {}) for _ in range(5)]
    )
    crasher = int(results[5].id)
    innocent = {int(r.id) for r in results} - {crasher}

    def settled() -> bool:
        return set(states()) <= {"failed", "succeeded"}

    deaths, survivor = 0, None
    for _ in range(8):
        worker = start_worker("--queues", "faults", "--lease-duration", "1", *FAST)  # the default pool of 20
        wait_until(
            lambda: worker.process.poll() is not None or settled(),
            what="the worker dying or every job settling",
            workers=[worker],
        )
        if worker.process.poll() is None:
            survivor = worker
            break
        assert worker.process.returncode == 3, worker.output
        deaths += 1
    assert survivor is not None, f"still dying after {deaths} deaths: {states()}"
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output

    assert states() == {"failed": 1, "succeeded": 10}
    log = history()
    job = Job.objects.get(id=crasher)
    assert job.state == "failed"
    assert [state for state, _ in log[crasher]] == ["lapsed"] * job.attempts == ["lapsed"] * deaths
    counted = [a for a in Attempt.objects.filter(job=job) if "not counted" not in a.traceback]
    assert len(counted) == job.max_attempts == 3, "the crasher pays exactly its max_attempts"
    assert "no attempts left, the job failed" in counted[-1].traceback
    for job_id in innocent:
        assert [state for state, _ in log[job_id]] == ["lapsed", "succeeded"], (job_id, log[job_id])
        (lapsed,) = Attempt.objects.filter(job_id=job_id, state="lapsed")
        assert "not counted" in lapsed.traceback
    assert Lease.objects.count() == 0, (list(Lease.objects.values()), survivor.output[-3000:])

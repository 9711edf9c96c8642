"""The real worker command in a subprocess, against the real test database."""

from __future__ import annotations

import signal
import time

import pytest

from backwave.models import Attempt, Job, Lease
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.5", "--log-every", "0.5")


def _states():
    return {state: Job.objects.filter(state=state).count() for state in Job.objects.values_list("state", flat=True).distinct()}


def test_every_job_succeeds_exactly_once(start_worker):
    results = enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(300)])
    worker = start_worker("--queues", "e2e", "--pool-size", "8", "--pumps", "2", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output
    assert _states() == {"succeeded": 300}
    # One attempt row per job, all succeeded, each with the job's own return value.
    assert Attempt.objects.count() == 300
    assert set(Attempt.objects.values_list("state", flat=True)) == {"succeeded"}
    returned = dict(Job.objects.values_list("id", "return_value"))
    assert {int(r.id): i for i, r in enumerate(results)} == returned
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert Lease.objects.count() == 0, "a drained worker leaves no lease behind"
    assert "stopped after 300 job(s)" in worker.output


def test_retries_with_backoff_then_succeeds(start_worker):
    result = worker_tasks.flaky.enqueue(succeed_on=3)
    worker = start_worker("--queues", "e2e", "--pool-size", "2", "--until-idle", *FAST)
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "succeeded", what="the flaky job succeeding")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    job = Job.objects.get(id=result.id)
    attempts = list(Attempt.objects.filter(job=job).order_by("number"))
    assert [a.state for a in attempts] == ["failed", "failed", "succeeded"]
    assert attempts[0].error_class == "builtins.RuntimeError"
    assert "attempt 1 fails on purpose" in attempts[0].traceback
    # Backoff: each retry waited at least half its nominal 0.05 s delay (database clock).
    for earlier, later in zip(attempts, attempts[1:]):
        assert (later.started_at - earlier.finished_at).total_seconds() >= 0.025
    # The context saw three attempts and one worker id per attempt.
    assert job.return_value["attempt"] == 3
    assert len(job.return_value["worker_ids"]) == 3
    refreshed = worker_tasks.flaky.get_result(result.id)
    assert refreshed.status == "SUCCESSFUL"
    assert refreshed.attempts == 3
    assert len(refreshed.errors) == 2


def test_failing_job_ends_failed_after_max_attempts(start_worker):
    result = worker_tasks.always_fails.enqueue()
    worker = start_worker("--queues", "e2e", "--until-idle", *FAST)
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "failed", what="the job failing for good")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    job = Job.objects.get(id=result.id)
    assert job.attempts == 2
    assert list(Attempt.objects.filter(job=job).values_list("state", flat=True)) == ["failed", "failed"]
    final = worker_tasks.always_fails.get_result(result.id)
    assert final.status == "FAILED"
    assert [e.exception_class_path for e in final.errors] == ["builtins.ValueError", "builtins.ValueError"]


def test_unknown_task_and_bad_payload_are_quarantined_not_retried(start_worker):
    unknown = Job.objects.create(
        task_path="somewhere.not_registered", queue="e2e", payload={"args": [], "kwargs": {}}, max_attempts=5
    )
    bad_payload = Job.objects.create(
        task_path=worker_tasks.noop.module_path, queue="e2e", payload=["not", "an", "object"], max_attempts=5
    )
    returns_set = worker_tasks.returns_set.enqueue()
    worker = start_worker("--queues", "e2e", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output
    for job in (unknown, bad_payload):
        job.refresh_from_db()
        assert job.state == "quarantined"
        assert job.attempts == 1
        (attempt,) = Attempt.objects.filter(job=job)
        assert attempt.state == "quarantined"
        assert attempt.error_class == "backwave.shell.execution.Unroutable"
    assert "no task named 'somewhere.not_registered' is registered" in Attempt.objects.get(job=unknown).traceback
    # A return value that is not JSON fails the attempt (it is a bug in the task, not a routing problem).
    job = Job.objects.get(id=returns_set.id)
    assert job.state == "failed"
    assert "not JSON-serialisable" in Attempt.objects.get(job=job).traceback


def test_handler_that_leaves_a_transaction_open_is_rolled_back(start_worker):
    target = worker_tasks.noop.enqueue(0)
    Job.objects.filter(id=target.id).update(queue="elsewhere")  # keep it out of the worker's way
    bad = worker_tasks.leaves_transaction_open.enqueue(int(target.id))
    after = [worker_tasks.counts_jobs.enqueue() for _ in range(4)]
    worker = start_worker("--queues", "e2e", "--pool-size", "1", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output
    assert Job.objects.get(id=bad.id).state == "succeeded"
    assert Job.objects.get(id=target.id).priority == 0, "the open transaction's write was rolled back"
    # The same (single) worker thread ran the next jobs on a clean connection.
    assert {Job.objects.get(id=r.id).state for r in after} == {"succeeded"}
    assert "left a transaction open" in worker.output


def test_sigterm_drains_running_jobs_and_leaves_the_rest_ready(start_worker):
    results = enqueue_many([(worker_tasks.sleeper, (0.6,), {}) for _ in range(12)])
    worker = start_worker("--queues", "slow", "--pool-size", "4", "--drain-timeout", "10", *FAST)
    worker.wait_for(lambda: Job.objects.filter(state="running").count() == 4, what="four jobs running")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output
    states = _states()
    assert states == {"succeeded": 4, "ready": 8}, states
    assert set(Job.objects.filter(state="ready").values_list("attempts", flat=True)) == {0}
    assert Lease.objects.count() == 0
    assert len(results) == 12


def test_drain_timeout_gives_unfinished_jobs_back_at_once(start_worker):
    enqueue_many([(worker_tasks.sleeper, (30,), {}) for _ in range(2)])
    worker = start_worker("--queues", "slow", "--pool-size", "2", "--drain-timeout", "0.3", *FAST)
    worker.wait_for(lambda: Job.objects.filter(state="running").count() == 2, what="two jobs running")
    worker.wait_for(lambda: "throughput:" in worker.output, what="a periodic throughput line")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output
    # Released, not failed: ready again, due now, and the interrupted attempt refunded.
    assert list(Job.objects.values_list("state", "attempts")) == [("ready", 0), ("ready", 0)]
    assert Attempt.objects.count() == 0
    assert Lease.objects.count() == 0


def test_second_signal_stops_at_once(start_worker):
    enqueue_many([(worker_tasks.sleeper, (30,), {}) for _ in range(2)])
    worker = start_worker("--queues", "slow", "--pool-size", "2", "--drain-timeout", "60", *FAST)
    worker.wait_for(lambda: Job.objects.filter(state="running").count() == 2, what="two jobs running")
    worker.signal(signal.SIGTERM)
    worker.signal(signal.SIGINT)
    worker.wait(timeout=10)
    # Nothing was written: the jobs stay under the lease until it lapses.
    assert Job.objects.filter(state="running").count() == 2
    assert "stopping at once" in worker.output


def _listener_backends():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'backwave-hints' AND datname = current_database()"
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_hint_wakes_an_idle_worker_long_before_its_poll(start_worker):
    # Poll every 60 s: only a wake-up hint can start the job within the wait below.
    worker = start_worker("--queues", "e2e", "--poll-interval", "60", "--log-every", "60")
    worker.wait_for(lambda: len(_listener_backends()) == 1, what="the hint listener connecting")
    worker.wait_for(lambda: Lease.objects.count() == 1, what="the pump opening its lease")
    worker.wait_for(lambda: Job.objects.count() == 0, timeout=1, what="an empty table")
    time.sleep(0.3)  # let the pump's first (empty) claim finish: the job must come from the hint
    result = worker_tasks.noop.enqueue(1)
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "succeeded", timeout=20, what="the hinted job running")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_with_the_listener_dead_polling_still_runs_every_job(start_worker):
    from django.db import connection

    worker = start_worker("--queues", "e2e", "--poll-interval", "0.3", "--log-every", "60")
    worker.wait_for(lambda: len(_listener_backends()) == 1, what="the hint listener connecting")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'backwave-hints' AND datname = current_database()"
        )
    results = enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(20)])
    worker.wait_for(lambda: Job.objects.filter(state="succeeded").count() == 20, what="every job running by polling")
    assert "hint listener lost its connection" in worker.output
    worker.wait_for(lambda: len(_listener_backends()) == 1, what="the listener reconnecting")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert len(results) == 20


def test_processes_supervises_children_and_sigterm_drains_them_all(start_worker):
    enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(200)])
    worker = start_worker("--queues", "e2e", "--processes", "2", "--pool-size", "4", *FAST)
    worker.wait_for(lambda: Job.objects.filter(state="succeeded").count() == 200, what="every job done by the children")
    # Two child processes, each with its own lease (worker ids are host:pid:group:pump:token).
    worker.wait_for(
        lambda: len({w.split(":")[1] for w in Lease.objects.values_list("worker_id", flat=True)}) == 2, what="two children"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    assert Lease.objects.count() == 0
    assert worker.output.count("BackWave worker stopped") == 2


def test_async_tasks_run_on_the_event_loop_alongside_sync_ones(start_worker):
    doubled = enqueue_many([(worker_tasks.async_double, (i,), {}) for i in range(30)])
    plain = enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(10)])
    failing = worker_tasks.async_fails.enqueue()
    worker = start_worker("--queues", "e2e", "--pool-size", "8", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output
    for i, result in enumerate(doubled):
        value = worker_tasks.async_double.get_result(result.id).return_value
        assert value["double"] == i * 2 and value["jobs"] >= 41
    assert {Job.objects.get(id=r.id).state for r in plain} == {"succeeded"}
    final = worker_tasks.async_fails.get_result(failing.id)
    assert final.status == "FAILED"
    assert final.errors[0].exception_class_path == "builtins.KeyError"


def test_a_queue_concurrency_limit_holds_across_worker_processes(start_worker, settings):
    """Three worker processes, pool 4 each, on a queue limited to 2: never more than 2 running."""
    import threading

    from django.db import connections

    from backwave.ops import actions as operations

    operations.limit_queues(["slow"], 2)
    enqueue_many([(worker_tasks.sleeper, (0.15,), {}) for _ in range(24)])
    peak = {"running": 0}
    stop = threading.Event()

    def sample():
        # A connection of its own, counting committed 'running' rows as fast as it can.
        with connections.create_connection("default").cursor() as cursor:
            while not stop.is_set():
                cursor.execute("SELECT count(*) FROM backwave_job WHERE queue = 'slow' AND state = 'running'")
                peak["running"] = max(peak["running"], cursor.fetchone()[0])

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [start_worker("--queues", "slow", "--pool-size", "4", *FAST) for _ in range(3)]
    # All three claim (every 50 ms) while the jobs run: the limit is contended, not just unused.
    workers[0].wait_for(lambda: Lease.objects.count() == 3, what="three workers claiming")
    try:
        workers[0].wait_for(lambda: Job.objects.filter(state="succeeded").count() == 24, timeout=60, what="all 24 jobs done")
    finally:
        stop.set()
        sampler.join()
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0
    assert peak["running"] == 2, peak


def test_a_paused_queue_waits_and_resumes(start_worker):
    from backwave.ops import actions as operations

    operations.pause_queues(["e2e"])
    results = enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(5)])
    worker = start_worker("--queues", "e2e", *FAST)
    worker.wait_for(lambda: Lease.objects.count() == 1, what="the worker polling")
    time.sleep(0.5)  # several polls go by
    assert Job.objects.filter(state="ready").count() == 5
    operations.resume_queues(["e2e"])
    worker.wait_for(lambda: Job.objects.filter(state="succeeded").count() == 5, what="the resumed queue draining")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert len(results) == 5


def test_a_killed_child_is_restarted_and_its_jobs_come_back_through_its_lease(start_worker):
    import os

    enqueue_many([(worker_tasks.sleeper, (0.3,), {}) for _ in range(16)])
    worker = start_worker(
        "--queues",
        "slow",
        "--processes",
        "2",
        "--pool-size",
        "4",
        "--lease-duration",
        "1",
        "--maintenance-interval",
        "0.3",
        "--poll-interval",
        "0.05",
        "--log-every",
        "60",
    )

    def child_pids():
        return {int(w.split(":")[1]) for w in Lease.objects.values_list("worker_id", flat=True)}

    worker.wait_for(
        lambda: len(child_pids()) == 2 and Job.objects.filter(state="running").count() >= 4, what="two children running jobs"
    )
    victim = next(iter(child_pids()))
    os.kill(victim, signal.SIGKILL)
    # The supervisor starts a replacement (a third pid shows up among the leases) ...
    worker.wait_for(lambda: len(child_pids() - {victim}) == 2, timeout=30, what="a replacement child")
    # ... and every job finishes, the killed child's through its lapsed lease.
    worker.wait_for(lambda: Job.objects.filter(state="succeeded").count() == 16, timeout=60, what="every job done")
    assert "restarting in" in worker.output
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output

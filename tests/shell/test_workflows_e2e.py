"""Workflows on the real worker command (two pumps, a pool each) against the real database: a
diamond passes its outputs in order, a fan-in of 200 runs once after all of them, a failing
ancestor cancels its dependents."""

from __future__ import annotations

import re

import pytest

from backwave.models import Attempt, Job
from backwave.tasking.workflow import chain, dag, group
from tests.shell import worker_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.5", "--log-every", "0.5")


def test_a_diamond_and_a_fan_in_run_in_order_on_a_real_worker(start_worker):
    diamond = dag(
        {
            "a": (worker_tasks.workflow_source, ["a", 3]),
            "b": (worker_tasks.workflow_combine, ["b"]),
            "c": (worker_tasks.workflow_combine, ["c"]),
            "d": (worker_tasks.workflow_combine, ["d"]),
        },
        after={"b": ["a"], "c": ["a"], "d": ["b", "c"]},
    )
    members, fan_in = group(
        [(worker_tasks.workflow_source, [f"m{n}", 1]) for n in range(200)], then=(worker_tasks.workflow_combine, ["sum"])
    )
    bad, doomed = dag(
        {"bad": (worker_tasks.workflow_fails,), "doomed": (worker_tasks.workflow_combine, ["x"])}, after={"doomed": ["bad"]}
    ).values()

    worker = start_worker("--queues", "e2e", "--pool-size", "4", "--pumps", "2", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output

    d = Job.objects.get(pk=diamond["d"].id)
    assert (d.state, d.return_value, d.output, d.tags) == ("succeeded", 6, {"value": 6, "name": "d"}, ["combined"])
    total = Job.objects.get(pk=fan_in.id)
    assert (total.state, total.return_value) == ("succeeded", 200)
    assert Attempt.objects.filter(job_id=fan_in.id).count() == 1  # released once, run once
    # Order by the database clock: every dependent's attempt began after its ancestors' ended.
    finished = dict(Attempt.objects.filter(state="succeeded").values_list("job_id", "finished_at"))
    started = dict(Attempt.objects.values_list("job_id", "started_at"))
    for dependent, ancestors in ((diamond["b"], ["a"]), (diamond["c"], ["a"]), (diamond["d"], ["b", "c"])):
        assert all(started[int(dependent.id)] >= finished[int(diamond[name].id)] for name in ancestors)
    assert all(started[int(fan_in.id)] >= finished[int(m.id)] for m in members)
    doomed_job = Job.objects.get(pk=doomed.id)
    assert (Job.objects.get(pk=bad.id).state, doomed_job.state) == ("failed", "cancelled")
    assert doomed_job.reason == f"Cancelled: ancestor #{bad.id} failed." and doomed_job.attempts == 0


def test_a_chain_costs_one_round_trip_a_link(start_worker):
    """Each link's outcome write releases the next job, and the claim riding that write takes
    it: one round-trip a link. The release also sends the queue's wake-up hint (for the pumps
    elsewhere); the pump that wrote it took its own hint too, and each link cost a second claim,
    which found nothing (a chain of 3,000 drained at 6% of the rate of as many independent jobs)."""
    chain(*[(worker_tasks.noop, (n,), {}) for n in range(100)])
    worker = start_worker(
        "--queues", "e2e", "--pool-size", "4", "--until-idle", "--poll-interval", "5", "--maintenance-interval", "60"
    )
    assert worker.wait() == 0, worker.output
    jobs, trips = map(int, re.search(r"stopped after (\d+) job\(s\) and (\d+) store round-trips", worker.output).groups())
    assert jobs == 100
    # Start-up (lease, health, one maintenance run) and stop take about ten.
    assert trips <= 100 + 15, worker.output

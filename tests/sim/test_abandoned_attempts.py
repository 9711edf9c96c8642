"""A bug the simulator found: the driver remembered the attempts it abandoned by job id only.

A pump that gave up a job with a lost lease, claimed it again once that lease had lapsed and
been expired, and then lost its new lease too, heard of both attempts ending and refused the
second one ("JobFinished cannot be accepted ...: job 7 is not executing on this pump"), so the
pump halted. Found by seed 100245 with --max-jobs 80 --max-nodes 4 --fault-phase 40.0 in a run
of 3,000 large seeds; fixed by keying abandoned attempts by (job id, attempt). The seed runs
under ``CLASSIC``: what the simulator drew then.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from backwave.core import events as ev
from backwave.core.driver import NodeDriver
from backwave.core.jobs import ClaimedJob
from backwave.core.options import WorkerGroupOptions
from backwave.testing.simulation import CLASSIC, run_seed

FIRST = ClaimedJob(
    id=7, task_path="t.t", queue="default", priority=0, payload={}, attempt=1, max_attempts=3, backoff_base=1, backoff_max=1
)


def abandon_twice() -> NodeDriver:
    """A driver that gave up attempt 1 of job 7, ran attempt 2, and gave that up too."""
    driver = NodeDriver(WorkerGroupOptions(name="g", pool_size=2, poll_interval=1000.0))
    driver.handle(ev.Started(now=0.0))
    driver.handle(ev.LeaseOpened(now=0.0, lease_id=uuid.UUID(int=1)))
    driver.handle(ev.ClaimReturned(now=0.1, jobs=(FIRST,)))
    driver.handle(ev.Tick(now=10.0))
    driver.handle(ev.LeaseRenewed(now=10.1, held=False))  # attempt 1 abandoned, its handler runs on
    driver.handle(ev.LeaseOpened(now=10.2, lease_id=uuid.UUID(int=2)))
    driver.handle(ev.ClaimReturned(now=20.0, jobs=(replace(FIRST, attempt=2),)))
    driver.handle(ev.Tick(now=20.3))
    driver.handle(ev.LeaseRenewed(now=20.4, held=False))  # attempt 2 abandoned too
    assert driver.stats.abandoned == 2
    return driver


@pytest.mark.parametrize("order", [(2, 1), (1, 2)], ids=["newer-first", "older-first"])
def test_both_abandoned_attempts_may_end_in_either_order(order):
    driver = abandon_twice()
    for attempt in order:
        assert driver.handle(ev.JobFinished(now=21.0 + attempt, job_id=7, attempt=attempt, result="succeeded")) == []
    assert driver.unreported == 0


def test_the_seed_that_found_it_passes():
    run_seed(100245, replace(CLASSIC, max_jobs=80, max_nodes=4, fault_phase=40.0))

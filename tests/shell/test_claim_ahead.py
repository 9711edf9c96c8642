"""Claim-ahead against the real store, and its settings: a pump whose tasks are known to be short
claims jobs beyond its threads, which wait in the driver for a thread (core/slots.py); a group
serving a queue under an admission limit never does."""

from __future__ import annotations

import time

import pytest

from backwave.conf import group_from_mapping
from backwave.core.options import WorkerGroupConfigError, WorkerGroupOptions, validate_groups
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.shell.pump import HEALTHY, Pump, PumpSnapshot
from backwave.tasking.registry import TaskRegistry
from backwave.store.postgres import PostgresStore
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks


def drain_on_one_thread(task, *, claim_ahead: int, store_factory=PostgresStore.from_django) -> None:
    """Eight jobs of ``task`` drained by a pump of one thread on the real store (claim batch 4, no
    linger); it drains cleanly and stays healthy."""
    enqueue_many([(task, (), {}) for _ in range(8)])
    options = WorkerGroupOptions(
        name="ahead",
        policy=Strict("e2e"),
        pool_size=1,
        max_claim_batch=4,
        claim_ahead=claim_ahead,
        outcome_linger=0.0,
        poll_interval=0.05,
        maintenance_interval=3600,
        lease_duration=600,
    )
    pump = Pump(options, 0, store_factory=store_factory, registry=TaskRegistry([task]))
    pump.start()
    try:
        deadline = time.monotonic() + 30
        while Job.objects.filter(state="succeeded").count() < 8:
            assert time.monotonic() < deadline, "the jobs did not finish in time"
            time.sleep(0.02)
    finally:
        pump.drain(timeout=5)
        assert pump.join(10)
    assert pump.health == HEALTHY


def _drain_with_one_thread(claim_ahead: int) -> list[int]:
    """Eight jobs on a pool of one thread; each returns how many jobs were claimed as it ran."""
    drain_on_one_thread(worker_tasks.counts_running, claim_ahead=claim_ahead)
    return list(Job.objects.order_by("id").values_list("return_value", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_pump_of_one_thread_claims_ahead_once_its_task_is_known_short():
    seen = _drain_with_one_thread(claim_ahead=3)
    # The first claim is for the one thread (nothing seen finishing yet); the write of its outcome
    # carries a claim for the thread and the three ahead, which are all claimed while the next runs.
    assert seen[0] == 1
    assert max(seen) == 4
    assert Job.objects.filter(attempts=1).count() == 8  # each ran once


@pytest.mark.django_db(transaction=True)
def test_without_claim_ahead_a_pump_holds_no_more_than_its_threads():
    assert set(_drain_with_one_thread(claim_ahead=0)) == {1}


def test_claim_ahead_defaults_to_none_a_claim_batch_and_takes_a_whole_number():
    assert group_from_mapping({"name": "g", "queues": ["e2e"]}).claim_ahead is None
    assert group_from_mapping({"name": "g", "queues": ["e2e"], "claim_ahead": 0}).claim_ahead == 0
    assert group_from_mapping({"name": "g", "queues": ["e2e"], "claim_ahead": 64}).jobs_ahead == 64
    for bad in ("4", 2.5, True):
        with pytest.raises(WorkerGroupConfigError, match="claim_ahead must be a whole number"):
            group_from_mapping({"name": "g", "queues": ["e2e"], "claim_ahead": bad})
    for bad in (-1, 10_001):
        with pytest.raises(WorkerGroupConfigError, match=r"claim_ahead must be a whole number of jobs from 0 .* to 10,000"):
            validate_groups([group_from_mapping({"name": "g", "queues": ["e2e"], "claim_ahead": bad})])


def test_a_group_serving_a_queue_under_an_admission_limit_claims_nothing_ahead():
    # tests/settings.py: "keyed" has a per-key concurrency limit, "rated" a rate limit.
    assert group_from_mapping({"name": "g", "queues": ["e2e", "rated"]}).jobs_ahead == 0
    assert group_from_mapping({"name": "g", "queues": ["keyed"], "claim_ahead": 0}).jobs_ahead == 0
    with pytest.raises(WorkerGroupConfigError, match=r"claim_ahead must be 0 for a group serving keyed, rated"):
        group_from_mapping({"name": "g", "queues": ["rated", "keyed"], "claim_ahead": 8})


def test_the_pump_publishes_how_many_jobs_wait_claimed_ahead():
    from tests.core.helpers import Trace
    from tests.core.test_driver_claim_ahead import AHEAD, claimed_ahead

    t = Trace.running(**AHEAD)
    claimed_ahead(t)
    snapshot = PumpSnapshot.of(t.driver)
    assert (snapshot.executing, snapshot.claimed_ahead, snapshot.in_flight) == (2, 2, 4)

"""claim_jobs: batch size, order, due time, lease fence, concurrency (every store kind)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from .helpers import LeaseRef, ago


def claim(store, lease, queues=("default",), limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=list(queues), limit=limit)


def test_claims_at_most_limit(store, lease, rows):
    rows.make_jobs(10)
    assert len(claim(store, lease, limit=4)) == 4
    assert rows.count("running") == 4


def test_underfilled_claim_returns_what_is_ready(store, lease, rows):
    rows.make_jobs(3)
    assert len(claim(store, lease, limit=32)) == 3
    assert claim(store, lease, limit=32) == []


def test_empty_queue_returns_empty_list(store, lease):
    before = store.round_trips
    assert claim(store, lease) == []
    assert store.round_trips == before + 1


@pytest.mark.parametrize(("queues", "limit"), [(["default"], 0), (["default"], -1), ([], 5)])
def test_nothing_to_claim_costs_no_round_trip(store, lease, queues, limit, rows):
    rows.make_jobs(2)
    before = store.round_trips
    assert store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=queues, limit=limit) == []
    assert store.round_trips == before


def test_a_bare_string_is_refused_as_queues(store, lease):
    with pytest.raises(TypeError, match=r"pass \['default'\]"):
        store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues="default", limit=1)


@pytest.mark.parametrize("queues", [["default"], ["default", "emails"]], ids=["one-queue", "two-queues"])
def test_claim_order_is_priority_desc_then_run_at_then_id(store, lease, queues, rows):
    """Within what one claim takes, the rows come back best first (priority, run_at, id)."""
    low_old = rows.make_jobs(1, priority=0, run_at=ago(300))[0]
    high_new = rows.make_jobs(1, priority=5, run_at=ago(10), queue=queues[-1])[0]
    high_old_a, high_old_b = rows.make_jobs(2, priority=5, run_at=ago(60))
    low_new = rows.make_jobs(1, priority=-3, run_at=ago(5), queue=queues[-1])[0]

    expected = [high_old_a.pk, high_old_b.pk, high_new.pk, low_old.pk, low_new.pk]
    assert [job.id for job in claim(store, lease, queues=queues, limit=10)] == expected


def test_a_batch_takes_the_best_rows_of_one_queue(store, lease, rows):
    rows.make_jobs(5, priority=0)
    best = rows.make_jobs(3, priority=9)
    assert [job.id for job in claim(store, lease, queues=["default"], limit=3)] == [job.pk for job in best]


def test_several_queues_are_taken_in_queue_order_first_then_priority(store, lease, rows):
    """Strict("default", "emails"): what "default" holds comes first, whatever the priorities."""
    first = rows.make_jobs(2, priority=0, queue="default")
    rows.make_jobs(3, priority=9, queue="emails")
    claimed = claim(store, lease, queues=["default", "emails"], limit=2)
    assert sorted(job.id for job in claimed) == [job.pk for job in first]
    rest = claim(store, lease, queues=["default", "emails"], limit=5)
    assert {job.queue for job in rest} == {"emails"} and len(rest) == 3


def test_only_the_named_queues_are_claimed(store, lease, rows):
    rows.make_jobs(2, queue="emails")
    reports = rows.make_jobs(2, queue="reports")
    assert [job.id for job in claim(store, lease, queues=["reports", "other"])] == [job.pk for job in reports]


def test_a_queue_named_twice_is_claimed_once(store, lease, rows):
    jobs = rows.make_jobs(3)
    assert [job.id for job in claim(store, lease, queues=["default", "default"], limit=3)] == [job.pk for job in jobs]


def test_a_job_due_in_the_future_is_not_claimed(store, lease, rows):
    rows.make_jobs(1, run_at=timezone.now() + timedelta(hours=1))
    due = rows.make_jobs(1)[0]
    assert [job.id for job in claim(store, lease)] == [due.pk]


def test_only_ready_jobs_are_claimed(store, lease, rows):
    for state in ("running", "succeeded", "failed", "cancelled", "quarantined"):
        rows.make_jobs(1, state=state, lease_id=lease.id if state == "running" else None)
    assert claim(store, lease) == []


def test_claim_counts_the_attempt_and_stamps_the_database_clock(store, lease, rows):
    job = rows.make_jobs(
        1,
        task_path="app.tasks.send",
        payload={"args": [1], "kwargs": {"x": "y"}},
        priority=7,
        max_attempts=4,
        backoff_base=2.0,
        backoff_max=60.0,
        backend="other",
    )[0]
    (claimed,) = claim(store, lease)

    row = rows.job(job.pk)
    assert (row.state, row.lease_id, row.worker_id, row.attempts) == ("running", lease.id, lease.worker_id, 1)
    assert row.started_at == row.last_attempted_at == claimed.attempted_at == claimed.started_at
    assert claimed.enqueued_at == row.enqueued_at
    assert (claimed.id, claimed.task_path, claimed.queue, claimed.priority, claimed.payload) == (
        job.pk,
        "app.tasks.send",
        "default",
        7,
        {"args": [1], "kwargs": {"x": "y"}},
    )
    assert (claimed.attempt, claimed.max_attempts, claimed.backoff_base, claimed.backoff_max, claimed.backend) == (
        1,
        4,
        2.0,
        60.0,
        "other",
    )
    assert claimed.previous_worker_ids == ()


def test_a_later_attempt_keeps_started_at_and_lists_earlier_workers(store, lease, open_lease, rows):
    first = open_lease("host:1:default:0")
    job = rows.make_jobs(1, max_attempts=3)[0]
    claim(store, first)
    rows.lapse(first.id)
    assert store.expire_leases(limit=10) == 1
    first_start = rows.job(job.pk).started_at

    (claimed,) = claim(store, lease)
    assert claimed.attempt == 2
    assert claimed.started_at == first_start
    assert claimed.attempted_at > first_start
    assert claimed.previous_worker_ids == ("host:1:default:0",)


def test_no_claim_under_a_lapsed_or_missing_lease(store, lease, rows):
    rows.make_jobs(2)
    rows.lapse(lease.id)
    assert claim(store, lease) == []
    assert claim(store, LeaseRef(id=uuid.uuid4(), worker_id="ghost")) == []
    assert rows.count("ready") == 2


@pytest.mark.stores("postgres", "memory")  # threads: Django's connection is per thread, outside the test's
@pytest.mark.parametrize("queues", [["default"], ["default", "emails", "reports"]], ids=["one-queue", "three-queues"])
def test_concurrent_claimers_never_share_a_row_and_drain_the_queue(make_store, open_lease, queues, rows):
    ids = {job.pk for queue in queues for job in rows.make_jobs(2000 // len(queues), queue=queue)}
    stores = [make_store(), make_store()]
    leases = [open_lease(f"host:1:default:{n}", on=s) for n, s in enumerate(stores)]
    start = threading.Barrier(2)
    # Both claimers hold a batch before either goes on, so they really drain the queue side by
    # side: left to the scheduler, one thread could take all 2,000 jobs from the in-memory store
    # within a single GIL switch interval, before the other ever ran.
    both_claiming = threading.Barrier(2)
    claimed: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            start.wait()
            while batch := stores[n].claim_jobs(lease_id=leases[n].id, worker_id=leases[n].worker_id, queues=queues, limit=7):
                assert len(batch) <= 7
                claimed[n].extend(job.id for job in batch)
                if len(claimed[n]) == len(batch):
                    both_claiming.wait(timeout=30)
        except BaseException as error:  # surfaced below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert set(claimed[0]).isdisjoint(claimed[1])
    assert len(claimed[0]) + len(claimed[1]) == len(ids)
    assert set(claimed[0]) | set(claimed[1]) == ids
    assert claimed[0] and claimed[1], "both claimers should have got work"
    assert {job.attempts for pk, job in rows.jobs().items() if pk in ids} == {1}


@pytest.mark.parametrize("queues", [["default"], ["default", "emails"]], ids=["one-queue", "two-queues"])
def test_the_trace_context_stored_at_enqueue_comes_back_with_the_claim(store, lease, queues):
    from backwave.store.contract import NewJob

    context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "vendor=x"}
    traced, untraced = store.enqueue_many(
        [
            NewJob(task_path="a.b", payload={"args": [], "kwargs": {}}, trace_context=context),
            NewJob(task_path="a.b", payload={"args": [], "kwargs": {}}),
        ]
    )
    claimed = {job.id: job.trace_context for job in claim(store, lease, queues=queues)}
    assert claimed == {traced: context, untraced: None}

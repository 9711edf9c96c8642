"""Queue settings in the claim: a paused queue is not claimed from, and a concurrency limit
holds across claimers (the cross-process proof with real workers is in tests/shell)."""

from __future__ import annotations

import threading

import pytest

from .helpers import LeaseRef


def claim(store, lease: LeaseRef, *, queues=("default",), limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=list(queues), limit=limit)


def test_a_paused_queue_is_not_claimed_from(store, lease, rows):
    rows.make_jobs(3, queue="emails")
    others = rows.make_jobs(2, queue="default")
    rows.set_queue("emails", paused=True)
    assert claim(store, lease, queues=["emails"]) == []
    assert sorted(job.id for job in claim(store, lease, queues=["emails", "default"])) == [job.pk for job in others]
    rows.set_queue("emails", paused=False)
    assert len(claim(store, lease, queues=["emails"])) == 3


def test_a_concurrency_limit_caps_running_jobs_of_the_queue(store, lease, rows):
    rows.make_jobs(10, queue="reports")
    rows.set_queue("reports", concurrency_limit=3)
    assert len(claim(store, lease, queues=["reports"], limit=10)) == 3
    assert claim(store, lease, queues=["reports"], limit=10) == []  # three running: no room
    assert rows.count("running") == 3


def test_the_limit_counts_per_queue_in_a_several_queue_claim(store, lease, rows):
    rows.make_jobs(5, queue="reports")
    rows.make_jobs(5, queue="default")
    rows.set_queue("reports", concurrency_limit=2)
    claimed = claim(store, lease, queues=["reports", "default"], limit=10)
    assert sorted(job.queue for job in claimed) == ["default"] * 5 + ["reports"] * 2


def test_finishing_a_job_makes_room_under_the_limit(store, lease, rows):
    from backwave.core.jobs import OutcomeKind
    from backwave.store.contract import OutcomeRecord

    rows.make_jobs(4, queue="reports")
    rows.set_queue("reports", concurrency_limit=2)
    first = claim(store, lease, queues=["reports"])
    assert len(first) == 2
    done = OutcomeRecord(job_id=first[0].id, attempt=first[0].attempt, kind=OutcomeKind.SUCCEEDED, return_value=None)
    applied, more = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[done], queues=["reports"], limit=10
    )
    assert applied == {first[0].id} and len(more) == 1


@pytest.mark.stores("postgres")
def test_concurrent_claimers_never_exceed_the_limit(make_store, open_lease, rows):
    """Eight stores (eight connections) claim from a limited queue, all at once."""
    rows.make_jobs(200, queue="reports")
    rows.set_queue("reports", concurrency_limit=5)
    stores = [make_store() for _ in range(8)]
    leases = [open_lease(f"w{index}", on=store) for index, store in enumerate(stores)]
    barrier = threading.Barrier(len(stores))
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer(store, lease):
        barrier.wait()
        for _ in range(5):
            got = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["reports"], limit=3)
            with lock:
                claimed.extend(job.id for job in got)

    threads = [threading.Thread(target=claimer, args=pair) for pair in zip(stores, leases)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claimed) == 5 == len(set(claimed))
    assert rows.count("running") == 5

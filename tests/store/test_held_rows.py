"""A job row an application's transaction holds never stalls the engine (every store kind).

An application may hold a running job's row for as long as its transaction stays open (an
enqueue after= it, a cancel, a select_for_update() in a long atomic()). The engine's statements
pass such a row over instead of waiting for it: the heartbeat renews the lease and keeps the
held job's report for the next one, the outcome write applies the rest of its batch and answers
the held one busy, expiry and the releases leave the held job (and its lease, lapsed) for later.
``rows.hold`` plays that transaction: a session of its own holding the rows FOR UPDATE on
PostgreSQL (its waits would end in the store's lock timeout, not an answer), held_rows in memory.
Not the django kind: its rows live in the test's own transaction, which no other session sees
(it sends the same statements as PostgresStore).
"""

from __future__ import annotations

import pytest

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import After, NewJob, OutcomeRecord, ProgressReport

pytestmark = pytest.mark.stores("postgres", "memory")


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


def new(after=(), max_attempts=1) -> NewJob:
    return NewJob(task_path="app.tasks.t", payload={"args": [], "kwargs": {}}, max_attempts=max_attempts, after=tuple(after))


def outcome(job, kind=OutcomeKind.SUCCEEDED):
    return OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=kind)


def test_a_held_row_costs_its_own_outcome_a_retry_and_the_rest_of_the_batch_lands(store, lease, rows):
    rows.make_jobs(3)
    held, first, second = claim(store, lease)
    with rows.hold(held.id):
        applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(first), outcome(held), outcome(second)])
        assert applied == {first.id, second.id} and applied.busy == {held.id}
        assert rows.states([held.id, first.id, second.id]) == {held.id: "running", first.id: "succeeded", second.id: "succeeded"}
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(held)])
    assert applied == {held.id} and not applied.busy
    assert [(a.job_id, a.state) for a in rows.attempts()].count((held.id, "succeeded")) == 1


def test_a_held_row_in_a_write_that_claims_too(store, lease, rows):
    rows.make_jobs(3)
    held, done = claim(store, lease, limit=2)
    with rows.hold(held.id):
        applied, claimed = store.write_outcomes_then_claim(
            lease_id=lease.id, worker_id=lease.worker_id, outcomes=[outcome(held), outcome(done)], queues=["default"], limit=5
        )
    assert applied == {done.id} and applied.busy == {held.id}
    assert len(claimed) == 1


def test_a_refused_outcome_is_not_busy(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job)])
    with rows.hold(job.id):
        applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job)])  # written already
    assert applied == set() and not applied.busy


def test_the_heartbeat_renews_the_lease_and_answers_the_held_report_busy(store, lease, rows):
    rows.make_jobs(2)
    held, other = claim(store, lease)
    before = rows.lease(lease.id).expires_at
    reports = [ProgressReport(job_id=job.id, attempt=job.attempt, progress={"n": 1}) for job in (held, other)]
    with rows.hold(held.id):
        beat = store.heartbeat(lease_id=lease.id, duration=60, progress=reports)
    assert beat.held and beat.busy == {held.id}
    assert rows.lease(lease.id).expires_at > before
    assert rows.job(other.id).progress == {"n": 1} and rows.job(held.id).progress is None


def test_expiry_passes_a_held_job_over_and_keeps_its_lease_for_a_later_run(store, lease, rows):
    rows.make_jobs(2)
    held, other = claim(store, lease)
    rows.lapse(lease.id)
    with rows.hold(held.id):
        assert store.expire_leases(limit=10) == 1
        assert rows.states([held.id, other.id]) == {held.id: "running", other.id: "ready"}
        assert rows.lease_ids() == [lease.id]
    assert store.expire_leases(limit=10) == 1
    assert rows.states([held.id]) == {held.id: "ready"}
    assert rows.lease_ids() == []


def test_releasing_the_lease_leaves_a_held_job_to_expiry(store, lease, rows):
    rows.make_jobs(2)
    held, other = claim(store, lease)
    with rows.hold(held.id):
        assert store.release_lease(lease_id=lease.id) == [other.id]
        assert rows.lease_ids() == [lease.id]  # kept, lapsed: no write of it lands any more
        assert not store.renew_lease(lease_id=lease.id, duration=60)
    assert store.expire_leases(limit=10) == 1
    assert rows.states([held.id, other.id]) == {held.id: "ready", other.id: "ready"}
    assert rows.lease_ids() == []


def test_releasing_jobs_and_reconciling_pass_a_held_job_over(store, lease, rows):
    rows.make_jobs(3)
    held, released, stray = claim(store, lease)
    with rows.hold(held.id):
        given_back = store.release_jobs_many(lease_id=lease.id, job_ids=[held.id, released.id])
        assert given_back == {released.id} and given_back.busy == {held.id}  # for the driver to send again
        reconciled = store.reconcile_lease(lease_id=lease.id, known=[(stray.id, stray.attempt)])
        assert reconciled == set() and reconciled.busy == {held.id}
    assert rows.states([held.id, released.id, stray.id]) == {held.id: "running", released.id: "ready", stray.id: "running"}
    given_back = store.release_jobs_many(lease_id=lease.id, job_ids=[held.id, released.id])  # released: not busy
    assert given_back == {held.id} and not given_back.busy
    assert rows.states([held.id]) == {held.id: "ready"}


def test_a_held_dependent_makes_its_ancestors_outcome_busy_and_the_rest_of_the_batch_lands(store, lease, rows):
    # An application holding a dependent (a cancel of it, a select_for_update() in a long
    # atomic()) while its ancestor finishes: the write settling that dependent would wait for it.
    ancestor, dependent, other = store.enqueue_many([new(), new(after=[After(position=0)]), new()])
    claimed = {job.id: job for job in claim(store, lease)}
    outcomes = [outcome(claimed[ancestor]), outcome(claimed[other])]
    with rows.hold(dependent):
        applied = store.write_outcomes_many(lease_id=lease.id, outcomes=outcomes)
        assert applied == {other} and applied.busy == {ancestor}
        assert rows.states([ancestor, dependent, other]) == {ancestor: "running", dependent: "waiting", other: "succeeded"}
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(claimed[ancestor])])
    assert applied == {ancestor} and applied.released == 1 and not applied.busy
    assert rows.states([ancestor, dependent]) == {ancestor: "succeeded", dependent: "ready"}


def test_a_retry_of_an_ancestor_is_not_held_by_its_dependent(store, lease, rows):
    ancestor, dependent = store.enqueue_many([new(max_attempts=3), new(after=[After(position=0)])])
    (job,) = claim(store, lease)
    with rows.hold(dependent):
        applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.RETRY)])
    assert applied == {ancestor} and not applied.busy

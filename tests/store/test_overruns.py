"""Overruns in every store: a handler that outlived its attempt (ended by its worker at a time
limit, or after a cancel's grace) still counts against its queue's concurrency limit and its
key's per-key limit, under its worker's live lease, until the worker forgets it.

The worker says so in the outcome it writes for that attempt (``OutcomeRecord.overrun``): the
job is ready again (or finished) at once, and from the same statement on its handler is counted
where its running row was. ``forget_overruns`` is the worker's word that the handler returned;
a lease that lapses or goes takes its overruns with it, so a dead worker holds no key for ever.
"""

from __future__ import annotations

import pytest

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import NewJob, OutcomeRecord

QUEUE = "default"


def _enqueue(store, count, *, key="acme"):
    return store.enqueue_many(
        [NewJob(task_path="tests.t", payload={"args": [n], "kwargs": {}}, limit_key=key, max_attempts=3) for n in range(count)]
    )


def _claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=limit)


def _timed_out(job, *, overrun=True, kind=OutcomeKind.RETRY):
    return OutcomeRecord(
        job_id=job.id,
        attempt=job.attempt,
        kind=kind,
        retry_delay=0.0,
        error_class="backwave.TimeLimitExceeded",
        traceback="ran past its time limit",
        overrun=overrun,
    )


@pytest.fixture(params=["per-key", "queue"])
def limited(request, rows, make_store):
    """A store whose queue has a limit of one: per key (claimed through the admitted claim), or
    the queue's own concurrency limit (the plain claim)."""
    if request.param == "per-key":
        rows.set_admission(QUEUE, key_concurrency_limit=1)
        return make_store(admitted_queues=[QUEUE])
    rows.set_queue(QUEUE, concurrency_limit=1)
    return make_store()


def test_an_overrun_counts_against_the_limit_until_it_is_forgotten(limited, rows, lease):
    first, second = _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    assert limited.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job)]) == {job.id}
    assert rows.states([first, second]) == {first: "ready", second: "ready"}  # the attempt ended; its handler did not
    assert _claim(limited, lease) == []
    assert rows.overruns() == [(job.id, 1, lease.id)]
    assert limited.forget_overruns(lease_id=lease.id, attempts=[(job.id, job.attempt)]) == 1
    assert rows.overruns() == []
    assert len(_claim(limited, lease)) == 1


def test_the_claim_riding_the_write_already_counts_the_overrun(limited, rows, lease):
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    applied, claimed = limited.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[_timed_out(job)], queues=[QUEUE], limit=10
    )
    assert applied == {job.id} and claimed == []


def test_an_overrun_of_a_finished_job_counts_too(limited, rows, lease):
    """A cancel the handler ignored ends the job, not the handler."""
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    limited.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job, kind=OutcomeKind.CANCELLED)])
    assert rows.job(job.id).state == "cancelled"
    assert _claim(limited, lease) == []


def test_an_outcome_without_overrun_leaves_nothing_behind(limited, rows, lease):
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    limited.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job, overrun=False)])
    assert rows.overruns() == []
    assert len(_claim(limited, lease)) == 1


def test_a_refused_outcome_leaves_no_overrun(limited, rows, lease, open_lease):
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    other = open_lease("host:2:default:0")
    assert limited.write_outcomes_many(lease_id=other.id, outcomes=[_timed_out(job)]) == set()
    assert rows.overruns() == []


def test_an_overrun_of_a_lapsed_lease_counts_no_more_and_goes_with_the_lease(limited, rows, lease, open_lease):
    """A worker that dies, or is cut off, holds no key for ever: its overruns count while its
    lease is live, and expiry deletes them with it."""
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    limited.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job)])
    rows.lapse(lease.id)
    other = open_lease("host:2:default:0")
    assert len(_claim(limited, other)) == 1
    assert limited.expire_leases(limit=10) == 0  # the lapsed lease ran nothing any more
    assert rows.overruns() == []


def test_a_released_lease_takes_its_overruns_along(limited, rows, lease):
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    limited.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job)])
    limited.release_lease(lease_id=lease.id)
    assert rows.overruns() == []


def test_only_its_own_lease_forgets_an_overrun(limited, rows, lease, open_lease):
    _enqueue(limited, 2)
    (job,) = _claim(limited, lease)
    limited.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job)])
    other = open_lease("host:2:default:0")
    assert limited.forget_overruns(lease_id=other.id, attempts=[(job.id, job.attempt)]) == 0
    assert limited.forget_overruns(lease_id=lease.id, attempts=[(job.id, job.attempt + 1)]) == 0
    assert _claim(limited, other) == []


def test_an_overrun_and_a_running_job_fill_a_key_limit_of_two(rows, make_store, lease):
    """A handler that outlived its attempt is one of the key's two, whichever job runs beside it
    (its own retry included)."""
    rows.set_admission(QUEUE, key_concurrency_limit=2)
    store = make_store(admitted_queues=[QUEUE])
    _enqueue(store, 3)
    (job,) = _claim(store, lease, limit=1)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job)])
    assert len(_claim(store, lease)) == 1
    assert _claim(store, lease) == []


def test_overruns_of_other_keys_and_queues_leave_them_alone(rows, make_store, lease):
    rows.set_admission(QUEUE, key_concurrency_limit=1)
    store = make_store(admitted_queues=[QUEUE])
    (busy,) = _enqueue(store, 1, key="busy")
    (job,) = _claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[_timed_out(job, kind=OutcomeKind.FAILED)])
    others = _enqueue(store, 2, key="other") + _enqueue(store, 1, key=None)
    assert sorted(j.id for j in _claim(store, lease)) == [others[0], others[2]]


def test_forgetting_nothing_is_a_no_op(store, lease):
    assert store.forget_overruns(lease_id=lease.id, attempts=[]) == 0

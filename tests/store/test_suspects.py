"""Who pays when a worker dies: expiry forgives a job once and makes it a suspect, and a claim
never puts two suspects under one lease, so a suspect whose lease lapses again pays alone
(every store kind)."""

from __future__ import annotations

import pytest

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import OutcomeRecord

from .helpers import ago


def claim(store, lease, queues=("default",), limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=list(queues), limit=limit)


def lapse_and_expire(store, lease, rows) -> int:
    rows.lapse(lease.id)
    return store.expire_leases(limit=10)


def suspects(rows) -> set[int]:
    return {pk for pk, job in rows.jobs().items() if job.suspect}


def test_the_first_lapse_is_forgiven_and_makes_every_job_under_the_lease_a_suspect(store, lease, rows):
    """max_attempts 1: yesterday each of these would have failed with the worker."""
    jobs = rows.make_jobs(3, max_attempts=1)
    claim(store, lease)
    assert lapse_and_expire(store, lease, rows) == 3

    for job in (rows.job(j.pk) for j in jobs):
        assert (job.state, job.attempts, job.forgiven_attempts, job.suspect, job.lease_id, job.finished_at) == (
            "ready",
            1,
            1,
            True,
            None,
            None,
        )
        assert job.run_at <= rows.now()
    lapsed = rows.attempts()
    assert [(a.number, a.state) for a in lapsed] == [(1, "lapsed")] * 3
    for attempt in lapsed:
        assert "Attempt 1 is not counted against max_attempts" in attempt.traceback
        assert "ready to run again" in attempt.traceback


def test_a_suspect_whose_lease_lapses_again_pays_until_its_attempts_are_used_up(store, open_lease, rows):
    (job,) = rows.make_jobs(1, max_attempts=2)
    first = open_lease("host:1:default:0")
    claim(store, first)
    lapse_and_expire(store, first, rows)  # forgiven

    second = open_lease("host:2:default:0")
    (again,) = claim(store, second)
    assert (again.attempt, again.forgiven_attempts, again.counted_attempt, again.suspect, again.max_attempts) == (
        2,
        1,
        1,
        True,
        2,
    )
    lapse_and_expire(store, second, rows)  # counted: 1 of 2
    row = rows.job(job.pk)
    assert (row.state, row.attempts, row.forgiven_attempts, row.suspect) == ("ready", 2, 1, True)

    third = open_lease("host:3:default:0")
    (last,) = claim(store, third)
    assert (last.attempt, last.counted_attempt) == (3, 2)
    lapse_and_expire(store, third, rows)  # counted: 2 of 2
    row = rows.job(job.pk)
    assert (row.state, row.attempts, row.forgiven_attempts, row.lease_id) == ("failed", 3, 1, None)
    assert row.finished_at is not None

    texts = [a.traceback for a in rows.attempts()]
    assert "Attempt 1 is not counted" in texts[0]
    assert "Attempt 2 counts (1 of 2)" in texts[1] and "ready to run again" in texts[1]
    assert "Attempt 3 counts (2 of 2)" in texts[2] and "no attempts left, the job failed" in texts[2]
    assert [a.worker_id for a in rows.attempts()] == [first.worker_id, second.worker_id, third.worker_id]


@pytest.mark.parametrize("kind", [OutcomeKind.SUCCEEDED, OutcomeKind.RETRY, OutcomeKind.FAILED])
def test_an_outcome_clears_suspect(store, open_lease, rows, kind):
    (job,) = rows.make_jobs(1, max_attempts=3)
    first = open_lease("host:1:default:0")
    claim(store, first)
    lapse_and_expire(store, first, rows)
    lease = open_lease("host:2:default:0")
    (again,) = claim(store, lease)
    assert again.suspect
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[OutcomeRecord(job_id=job.pk, attempt=2, kind=kind)]) == {job.pk}
    row = rows.job(job.pk)
    assert (row.suspect, row.forgiven_attempts) == (False, 1)


def test_a_claim_takes_at_most_one_suspect_and_none_while_its_lease_runs_one(store, lease, open_lease, rows):
    rows.make_jobs(3, suspect=True, run_at=ago(60))
    ordinary = rows.make_jobs(2)
    claimed = claim(store, lease)
    assert sorted(job.suspect for job in claimed) == [False, False, True]
    assert {job.id for job in claimed if not job.suspect} == {job.pk for job in ordinary}
    (held,) = [job for job in claimed if job.suspect]

    assert claim(store, lease) == []  # two suspects are ready, but this lease runs one
    (other,) = claim(store, open_lease("host:2:default:0"))  # another pump takes one
    assert other.suspect

    # Once the suspect's outcome is written, its lease may take the last one, in the same round-trip.
    done = OutcomeRecord(job_id=held.id, attempt=held.attempt, kind=OutcomeKind.SUCCEEDED)
    applied, (last,) = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[done], queues=["default"], limit=10
    )
    assert applied == {held.id} and last.suspect
    assert rows.count("ready") == 0


def test_suspects_never_hold_back_the_jobs_behind_them(store, lease, rows):
    """Five suspects first in claim order, three ordinary jobs behind: a claim of three takes one
    suspect and the two best ordinary jobs, not a short batch."""
    waiting = rows.make_jobs(5, suspect=True, priority=5)
    ordinary = rows.make_jobs(3, priority=0)
    claimed = claim(store, lease, limit=3)
    assert [job.id for job in claimed] == [waiting[0].pk, ordinary[0].pk, ordinary[1].pk]


def test_a_suspect_waits_its_turn_in_claim_order(store, lease, open_lease, rows):
    older = rows.make_jobs(3, run_at=ago(60))
    (suspect,) = rows.make_jobs(1, suspect=True, run_at=ago(10))
    assert [job.id for job in claim(store, lease, limit=2)] == [older[0].pk, older[1].pk]
    assert rows.states([suspect.pk]) == {suspect.pk: "ready"}
    assert [job.id for job in claim(store, open_lease("host:2:default:0"), limit=2)] == [older[2].pk, suspect.pk]


def test_one_suspect_across_the_queues_of_a_claim(store, lease, rows):
    (first,) = rows.make_jobs(1, queue="emails", suspect=True)
    rows.make_jobs(1, queue="default", suspect=True)
    ordinary = rows.make_jobs(2, queue="default")
    claimed = claim(store, lease, queues=["emails", "default"])
    assert [job.id for job in claimed] == [first.pk, *(job.pk for job in ordinary)]


@pytest.mark.parametrize("queues", [["reports"], ["reports", "default"]], ids=["one-queue", "two-queues"])
def test_a_suspect_takes_its_share_of_a_concurrency_limit(store, lease, rows, queues):
    rows.set_queue("reports", concurrency_limit=2)
    (suspect,) = rows.make_jobs(1, queue="reports", suspect=True, run_at=ago(60))
    ordinary = rows.make_jobs(3, queue="reports")
    claimed = claim(store, lease, queues=queues)
    assert [job.id for job in claimed] == [suspect.pk, ordinary[0].pk]


def test_a_paused_queue_gives_no_suspect(store, lease, rows):
    rows.make_jobs(1, queue="reports", suspect=True)
    rows.set_queue("reports", paused=True)
    assert claim(store, lease, queues=["reports"]) == []
    assert claim(store, lease, queues=["reports", "default"]) == []


def test_giving_a_job_back_leaves_it_suspect(store, lease, rows):
    """A release or a reconcile refunds an attempt that never ended; nothing cleared the job."""
    (job,) = rows.make_jobs(1, suspect=True)
    claim(store, lease)
    assert store.release_lease(lease_id=lease.id) == [job.pk]
    row = rows.job(job.pk)
    assert (row.state, row.attempts, row.suspect) == ("ready", 0, True)

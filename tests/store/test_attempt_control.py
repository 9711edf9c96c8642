"""Attempt control in the store (every store kind): snoozed and cancelled outcomes, the time
limit and a pending cancel a claim hands over, and the heartbeat that carries progress and
brings cancels back."""

from __future__ import annotations

import pytest

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import OutcomeRecord, ProgressReport


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


def test_a_snooze_makes_the_job_ready_later_without_counting_the_attempt(store, lease, rows):
    (made,) = rows.make_jobs(1, max_attempts=1)
    (job,) = claim(store, lease)
    before = rows.now()
    applied = store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            OutcomeRecord(
                job_id=job.id,
                attempt=1,
                kind=OutcomeKind.SNOOZED,
                retry_delay=60.0,
                error_class="backwave.Snooze",
                traceback="snoozed for 60 s",
            )
        ],
    )
    assert applied == {job.id}
    row = rows.job(made.pk)
    assert (row.state, row.attempts, row.forgiven_attempts, row.finished_at) == ("ready", 1, 1, None)
    assert row.run_at >= before + __import__("datetime").timedelta(seconds=59)
    assert [(a.number, a.state) for a in rows.attempts()] == [(1, "snoozed")]


def test_a_snoozed_job_with_one_attempt_still_has_its_attempt(store, lease, rows):
    rows.make_jobs(1, max_attempts=1)
    (job,) = claim(store, lease)
    store.write_outcomes_many(
        lease_id=lease.id, outcomes=[OutcomeRecord(job_id=job.id, attempt=1, kind=OutcomeKind.SNOOZED, retry_delay=0.0)]
    )
    (again,) = claim(store, lease)
    assert (again.attempt, again.forgiven_attempts, again.counted_attempt) == (2, 1, 1)


def test_a_cancelled_outcome_ends_the_job_and_logs_a_cancelled_attempt(store, lease, rows):
    (made,) = rows.make_jobs(1, max_attempts=5)
    (job,) = claim(store, lease)
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            OutcomeRecord(
                job_id=job.id,
                attempt=1,
                kind=OutcomeKind.CANCELLED,
                error_class="backwave.Cancelled",
                traceback="cancelled by api",
            )
        ],
    )
    row = rows.job(made.pk)
    assert row.state == "cancelled" and row.finished_at is not None
    assert [(a.state, a.error_class, a.traceback) for a in rows.attempts()] == [
        ("cancelled", "backwave.Cancelled", "cancelled by api")
    ]


def test_a_claim_hands_over_the_time_limit_and_a_pending_cancel(store, lease, rows):
    limited, cancelled, plain = rows.make_jobs(3)
    for made, timeout in ((limited, 2.5), (cancelled, None), (plain, None)):
        if timeout is not None:
            _set(rows, made.pk, timeout=timeout)
    rows.request_cancel(cancelled.pk, "admin:alice")
    claimed = {job.id: job for job in claim(store, lease)}
    assert (claimed[limited.pk].timeout, claimed[limited.pk].cancel_requested_by) == (2.5, None)
    assert claimed[cancelled.pk].cancel_requested_by == "admin:alice"
    assert (claimed[plain.pk].timeout, claimed[plain.pk].cancel_requested_by) == (None, None)


def test_the_heartbeat_writes_progress_and_answers_the_cancels_of_its_lease(store, lease, open_lease, rows):
    first, second, elsewhere = rows.make_jobs(3)
    a, b = claim(store, lease, limit=2)
    other = open_lease("host:2:default:0")
    (c,) = claim(store, other)
    rows.request_cancel(b.id, "api")
    rows.request_cancel(c.id, "api")
    beat = store.heartbeat(
        lease_id=lease.id,
        duration=60,
        progress=[
            ProgressReport(job_id=a.id, attempt=1, progress={"done": 3, "of": 10}, metadata={"trace": "x"}),
            ProgressReport(job_id=c.id, attempt=1, progress=99),  # not this lease's: fenced out
        ],
    )
    assert beat.held is True
    assert beat.cancels == {b.id: "api"}
    assert (rows.job(a.id).progress, rows.job(a.id).metadata) == ({"done": 3, "of": 10}, {"trace": "x"})
    assert rows.job(c.id).progress is None
    # None keeps what the row holds; the outcome's last report sticks.
    store.heartbeat(lease_id=lease.id, duration=60, progress=[ProgressReport(job_id=a.id, attempt=1, metadata={"trace": "y"})])
    assert (rows.job(a.id).progress, rows.job(a.id).metadata) == ({"done": 3, "of": 10}, {"trace": "y"})
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[OutcomeRecord(job_id=a.id, attempt=1, kind=OutcomeKind.SUCCEEDED, progress={"done": 10, "of": 10})],
    )
    assert rows.job(a.id).progress == {"done": 10, "of": 10}


def test_a_lapsed_lease_heartbeats_nothing(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    rows.request_cancel(job.id, "api")
    rows.lapse(lease.id)
    beat = store.heartbeat(lease_id=lease.id, duration=60, progress=[ProgressReport(job_id=job.id, attempt=1, progress=1)])
    assert (beat.held, beat.cancels) == (False, {})
    assert rows.job(job.id).progress is None


@pytest.mark.parametrize("bad", ["\ud800", "a\x00b", float("nan")])
def test_progress_postgresql_cannot_store_never_costs_the_lease(store, lease, rows, bad):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    beat = store.heartbeat(
        lease_id=lease.id, duration=60, progress=[ProgressReport(job_id=job.id, attempt=1, progress={"x": bad})]
    )
    assert beat.held is True
    assert rows.job(job.id).progress is None


def _set(rows, pk, **fields):
    job = rows.job(pk)
    if hasattr(job, "save"):
        type(job).objects.filter(pk=pk).update(**fields)
    else:
        for name, value in fields.items():
            setattr(job, name, value)


def test_a_heartbeat_with_every_running_attempts_progress_is_one_round_trip(store, lease, rows):
    rows.make_jobs(5)
    jobs = claim(store, lease)
    before = store.round_trips
    store.heartbeat(
        lease_id=lease.id, duration=60, progress=[ProgressReport(job_id=job.id, attempt=1, progress=job.id) for job in jobs]
    )
    assert store.round_trips == before + 1
    assert [rows.job(job.id).progress for job in jobs] == [job.id for job in jobs]

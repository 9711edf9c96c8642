"""Leases: the database clock, heartbeat, release, and maintenance expiry (every store kind,
but for what only PostgreSQL has: another session's row locks, the psycopg wire)."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import OutcomeRecord


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


@pytest.fixture
def host_clock_one_hour_ahead(monkeypatch):
    """The host's wall clock runs an hour fast for the test (time.time and Django's now)."""
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    monkeypatch.setattr(timezone, "now", lambda: dt.datetime.now(dt.UTC) + timedelta(hours=1))


@pytest.fixture
def sent_parameters(monkeypatch):
    """Every parameter psycopg sends from now on (Django's cursors included)."""
    sent: list = []
    real_execute = psycopg.Cursor.execute

    def spy(self, query, params=None, **kwargs):
        sent.extend(params.values() if isinstance(params, dict) else params or ())
        return real_execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", spy)
    return sent


# -- the database clock ----------------------------------------------------------------------


@pytest.mark.stores("postgres", "django")  # the host clock against the server's
def test_the_database_clock_stamps_a_lease(store, host_clock_one_hour_ahead, rows):
    lease_id = uuid.uuid4()
    before = rows.now()
    store.open_lease(lease_id=lease_id, worker_id="w", group="default", hostname="h", pid=7, duration=30)
    after = rows.now()

    lease = rows.lease(lease_id)
    assert before <= lease.created_at == lease.renewed_at <= after
    assert before + timedelta(seconds=30) <= lease.expires_at <= after + timedelta(seconds=30)
    assert timezone.now() - lease.expires_at > timedelta(minutes=50)  # the fast host clock played no part
    assert (lease.worker_id, lease.group, lease.hostname, lease.pid) == ("w", "default", "h", 7)


@pytest.mark.stores("postgres")  # what psycopg sends (the django kind sends back a time it read from the server)
def test_no_host_time_is_ever_sent(store, lease, sent_parameters, rows):
    rows.make_jobs(3)
    sent_parameters.clear()
    jobs = claim(store, lease)
    store.renew_lease(lease_id=lease.id, duration=60)
    store.write_outcomes_then_claim(
        lease_id=lease.id,
        worker_id=lease.worker_id,
        queues=["default"],
        limit=1,
        outcomes=[OutcomeRecord(job_id=jobs[0].id, attempt=1, kind=OutcomeKind.RETRY, retry_delay=5.0, duration=0.5)],
    )
    store.release_jobs_many(lease_id=lease.id, job_ids=[jobs[1].id])
    store.expire_leases(limit=10)
    store.release_lease(lease_id=lease.id)

    assert sent_parameters, "the spy saw nothing"
    assert not [p for p in sent_parameters if isinstance(p, dt.date | dt.time)]


# -- heartbeat -------------------------------------------------------------------------------


def test_renewal_pushes_only_its_own_lease(store, lease, open_lease, rows):
    other = open_lease("host:2:default:0", duration=45)
    other_before = rows.lease(other.id).expires_at
    before = rows.now()
    assert store.renew_lease(lease_id=lease.id, duration=600) is True
    after = rows.now()
    assert before + timedelta(seconds=600) <= rows.lease(lease.id).expires_at <= after + timedelta(seconds=600)
    assert rows.lease(other.id).expires_at == other_before


def test_renewing_a_missing_lease_reports_false(store):
    assert store.renew_lease(lease_id=uuid.uuid4(), duration=60) is False


def test_a_lapsed_lease_is_not_revived(store, lease, rows):
    rows.lapse(lease.id)
    expired_at = rows.lease(lease.id).expires_at
    assert store.renew_lease(lease_id=lease.id, duration=60) is False
    assert rows.lease(lease.id).expires_at == expired_at


def test_a_lease_duration_must_be_positive(store):
    with pytest.raises(ValueError, match="positive number of seconds"):
        store.renew_lease(lease_id=uuid.uuid4(), duration=0)


# -- release ---------------------------------------------------------------------------------


def test_release_lease_hands_running_jobs_back_and_deletes_the_lease(store, lease, open_lease, rows):
    other = open_lease("host:2:default:0")
    rows.make_jobs(5)
    finished, *running = claim(store, lease, limit=4)
    (theirs,) = claim(store, other, limit=1)
    store.write_outcomes_many(
        lease_id=lease.id, outcomes=[OutcomeRecord(job_id=finished.id, attempt=1, kind=OutcomeKind.SUCCEEDED)]
    )
    before = store.round_trips

    assert store.release_lease(lease_id=lease.id) == sorted(job.id for job in running)

    assert store.round_trips == before + 1
    assert rows.lease(lease.id) is None
    for job in (rows.job(job.id) for job in running):
        assert (job.state, job.attempts, job.lease_id, job.started_at) == ("ready", 0, None, None)
        assert job.run_at <= rows.now()
    assert rows.states([finished.id, theirs.id]) == {finished.id: "succeeded", theirs.id: "running"}
    assert store.release_lease(lease_id=lease.id) == []


def test_release_jobs_many_refunds_the_attempt_fenced_like_outcomes(store, lease, open_lease, rows):
    other = open_lease("host:2:default:0")
    rows.make_jobs(4, max_attempts=5)
    first, second, kept = claim(store, lease, limit=3)
    (theirs,) = claim(store, other, limit=1)
    # A job on its second attempt keeps the start of its first.
    store.write_outcomes_many(lease_id=lease.id, outcomes=[OutcomeRecord(job_id=second.id, attempt=1, kind=OutcomeKind.RETRY)])
    (second,) = claim(store, lease, limit=1)
    assert second.attempt == 2

    assert store.release_jobs_many(lease_id=lease.id, job_ids=[first.id, second.id, theirs.id]) == {first.id, second.id}

    jobs = rows.jobs()
    assert (jobs[first.id].state, jobs[first.id].attempts, jobs[first.id].started_at) == ("ready", 0, None)
    assert (jobs[second.id].state, jobs[second.id].attempts, jobs[second.id].started_at) == ("ready", 1, second.started_at)
    assert (jobs[kept.id].state, jobs[theirs.id].state) == ("running", "running")


def test_release_jobs_many_under_a_lapsed_lease_changes_nothing(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    rows.lapse(lease.id)
    assert store.release_jobs_many(lease_id=lease.id, job_ids=[job.id]) == set()
    assert rows.states([job.id]) == {job.id: "running"}


def test_releasing_nothing_costs_no_round_trip(store, lease):
    before = store.round_trips
    assert store.release_jobs_many(lease_id=lease.id, job_ids=[]) == set()
    assert store.expire_leases(limit=0) == 0
    assert store.round_trips == before


# -- expiry ----------------------------------------------------------------------------------


def test_expiry_releases_a_lapsed_lease_and_leaves_live_ones_alone(store, lease, open_lease, rows):
    live = open_lease("host:2:default:0")
    # `last` is a suspect (its previous attempt lapsed too): it pays; `again` is forgiven.
    again, last = rows.make_jobs(1, max_attempts=2) + rows.make_jobs(1, max_attempts=1, suspect=True)
    claim(store, lease, limit=2)
    rows.make_jobs(1)
    (live_job,) = claim(store, live)
    rows.lapse(lease.id, seconds_ago=5)
    expired_at = rows.lease(lease.id).expires_at
    renewed_at = rows.lease(lease.id).renewed_at

    assert store.expire_leases(limit=100) == 2

    assert rows.lease(lease.id) is None
    assert rows.lease(live.id) is not None
    jobs = rows.jobs()
    assert (jobs[again.pk].state, jobs[again.pk].attempts, jobs[again.pk].lease_id, jobs[again.pk].finished_at) == (
        "ready",
        1,
        None,
        None,
    )
    assert (jobs[last.pk].state, jobs[last.pk].lease_id) == ("failed", None)
    assert jobs[last.pk].finished_at is not None
    assert jobs[live_job.id].state == "running"

    attempts = {a.job_id: a for a in rows.attempts()}
    assert set(attempts) == {again.pk, last.pk}
    for job_id, attempt in attempts.items():
        assert (attempt.number, attempt.state, attempt.worker_id, attempt.error_class) == (
            1,
            "lapsed",
            lease.worker_id,
            "backwave.results.LeaseLapsed",
        )
        assert attempt.started_at == jobs[job_id].last_attempted_at
        # When it last ran for sure (the lease's renewal, or its claim if later), not when the
        # lapse was noticed.
        assert attempt.lease_renewed_at == max(renewed_at, attempt.started_at)
        assert attempt.lease_renewed_at <= attempt.finished_at
        assert lease.worker_id in attempt.traceback
        assert "expired at" in attempt.traceback and str(expired_at.year) in attempt.traceback
    assert "ready to run again" in attempts[again.pk].traceback
    assert "no attempts left" in attempts[last.pk].traceback


def test_expiry_takes_the_oldest_leases_first_up_to_the_limit(store, open_lease, rows):
    leases = [open_lease(f"host:1:default:{n}") for n in range(3)]
    for n, lease in enumerate(leases):
        rows.make_jobs(1)
        claim(store, lease)
        rows.lapse(lease.id, seconds_ago=30 - n)
    assert store.expire_leases(limit=2) == 2
    assert rows.lease_ids() == [leases[2].id]
    assert store.expire_leases(limit=2) == 1
    assert store.expire_leases(limit=2) == 0


def test_a_lapsed_lease_without_jobs_is_just_deleted(store, lease, rows):
    rows.lapse(lease.id)
    assert store.expire_leases(limit=10) == 0
    assert rows.lease_ids() == []


@pytest.mark.stores("postgres")  # a lock another session holds
def test_expiry_skips_a_lease_another_transaction_holds(store, open_lease, rows):
    held, free = open_lease("host:1:default:0"), open_lease("host:1:default:1")
    for lease in (held, free):
        rows.make_jobs(1)
        claim(store, lease)
        rows.lapse(lease.id)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT id FROM backwave_lease WHERE id = %s FOR UPDATE", [held.id])
        assert store.expire_leases(limit=10) == 1  # did not wait for the held lease
    assert rows.lease_ids() == [held.id]
    assert store.expire_leases(limit=10) == 1


@pytest.mark.stores("postgres", "memory")  # threads: Django's connection is per thread
def test_two_expiry_runs_at_once_release_each_lease_once(make_store, store, open_lease, rows):
    leases = [open_lease(f"host:1:default:{n}") for n in range(30)]
    for lease in leases:
        rows.make_jobs(2, max_attempts=3)
        claim(store, lease)
        rows.lapse(lease.id)
    runners = [make_store(), make_store()]
    start = threading.Barrier(2)
    released = [0, 0]

    def run(n: int) -> None:
        start.wait()
        while count := runners[n].expire_leases(limit=4):
            released[n] += count

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(released) == 60
    assert rows.lease_ids() == []
    assert sum(a.state == "lapsed" for a in rows.attempts()) == 60
    assert {(job.state, job.attempts) for job in rows.jobs().values()} == {("ready", 1)}


def test_expiry_never_resurrects_a_finished_job(store, lease, rows):
    rows.make_jobs(3)
    done, cancelled, running = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[OutcomeRecord(job_id=done.id, attempt=1, kind=OutcomeKind.SUCCEEDED)])
    # An operator's cancel that left the lease token on the row: only the state says "finished".
    rows.set_state(cancelled.id, "cancelled")
    rows.lapse(lease.id)

    assert store.expire_leases(limit=10) == 1
    assert rows.states([done.id, cancelled.id, running.id]) == {
        done.id: "succeeded",
        cancelled.id: "cancelled",
        running.id: "ready",
    }
    assert [(a.job_id, a.state) for a in rows.attempts()] == [(done.id, "succeeded"), (running.id, "lapsed")]


@pytest.mark.stores("postgres")  # a lock another session holds
def test_a_job_finished_while_expiry_runs_is_not_resurrected(store, lease, rows):
    rows.make_jobs(2)
    finishing, other = claim(store, lease)
    rows.lapse(lease.id)

    with transaction.atomic(), connection.cursor() as cursor:
        # Finish the job in a transaction still open: expiry does not wait for its row, it
        # releases the other job and leaves the lease, lapsed, for a later run.
        cursor.execute("UPDATE backwave_job SET state = 'succeeded', finished_at = now() WHERE id = %s", [finishing.id])
        assert store.expire_leases(limit=10) == 1
        assert rows.lease_ids() == [lease.id]
    assert store.expire_leases(limit=10) == 0  # committed meanwhile: finished, nothing to release

    assert rows.states([finishing.id, other.id]) == {finishing.id: "succeeded", other.id: "ready"}
    assert [(a.job_id, a.state) for a in rows.attempts()] == [(other.id, "lapsed")]
    assert rows.lease_ids() == []


def test_reconcile_gives_back_only_what_the_pump_does_not_hold(store, lease, rows):
    """A claim whose answer was lost committed three jobs the pump never heard of."""
    jobs = rows.make_jobs(5)
    claimed = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=5)
    held = [(job.id, job.attempt) for job in claimed[:2]]
    released = store.reconcile_lease(lease_id=lease.id, known=held)
    assert released == {(job.id, 1) for job in claimed[2:]}
    states = rows.states([job.pk for job in jobs])
    assert sorted(states.values()) == ["ready", "ready", "ready", "running", "running"]
    assert all(rows.job(pk).attempts == 0 for pk, _ in released), "the attempt that never ran is refunded"
    assert store.reconcile_lease(lease_id=lease.id, known=held) == set()


def test_reconcile_gives_back_a_later_attempt_of_a_job_the_pump_knows_at_an_earlier_one(store, lease, rows):
    """A retry due at once: its write and the claim riding on it committed, and took the job back as
    attempt 2 under the same lease, but the reply was lost. The pump still holds attempt 1's
    outcome; attempt 2, which no one runs, is given back (a job held at its attempt is kept)."""
    rows.make_jobs(2, max_attempts=3)
    first, kept = claim(store, lease, limit=2)
    retry = OutcomeRecord(job_id=first.id, attempt=1, kind=OutcomeKind.RETRY, retry_delay=0.0)
    applied, (second,) = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[retry], queues=["default"], limit=1
    )
    assert (applied, second.id, second.attempt) == ({first.id}, first.id, 2)

    assert store.reconcile_lease(lease_id=lease.id, known=[(first.id, 1), (kept.id, 1)]) == {(first.id, 2)}

    job = rows.job(first.id)
    assert (job.state, job.attempts, job.lease_id) == ("ready", 1, None)
    assert rows.states([kept.id]) == {kept.id: "running"}
    assert [(a.job_id, a.number, a.state) for a in rows.attempts()] == [(first.id, 1, "failed")]
    assert store.reconcile_lease(lease_id=lease.id, known=[(kept.id, 1)]) == set()


@pytest.mark.parametrize("known", [[1], [(1, "2")], [(1, 2, 3)]], ids=["a bare id", "a text attempt", "a triple"])
def test_reconcile_refuses_what_is_not_job_attempt_pairs_before_sending(store, lease, known):
    before = store.round_trips
    with pytest.raises(TypeError, match=r"\(job id, attempt\) pairs of integers"):
        store.reconcile_lease(lease_id=lease.id, known=known)
    assert store.round_trips == before

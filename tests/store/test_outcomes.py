"""write_outcomes_many and write_outcomes_then_claim: the Effect-Once fence and the attempt log
(every store kind)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from backwave.core.jobs import OutcomeKind
from backwave.store import queries
from backwave.store.contract import OutcomeRecord, StoreError

from .helpers import ago


def claim(store, lease, limit=10, queues=("default",)):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=list(queues), limit=limit)


def outcome(job, kind=OutcomeKind.SUCCEEDED, **fields):
    return OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=kind, **fields)


def test_each_kind_moves_the_job_on(store, lease, rows):
    rows.make_jobs(4)
    ok, retry, dead, unroutable = claim(store, lease)
    applied = store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            outcome(ok, return_value={"sent": 3}),
            outcome(retry, OutcomeKind.RETRY, retry_delay=30, error_class="builtins.ValueError", traceback="tb"),
            outcome(dead, OutcomeKind.FAILED, error_class="builtins.KeyError"),
            outcome(unroutable, OutcomeKind.QUARANTINED, error_class="backwave.Unroutable"),
        ],
    )
    assert applied == {ok.id, retry.id, dead.id, unroutable.id}
    jobs = {pk: rows.job(pk) for pk in applied}
    assert {pk: row.state for pk, row in jobs.items()} == {
        ok.id: "succeeded",
        retry.id: "ready",
        dead.id: "failed",
        unroutable.id: "quarantined",
    }
    assert all(row.lease_id is None for row in jobs.values())
    assert jobs[ok.id].return_value == {"sent": 3}
    assert jobs[retry.id].finished_at is None
    assert all(jobs[pk].finished_at is not None for pk in (ok.id, dead.id, unroutable.id))
    assert jobs[retry.id].attempts == 1  # counted at claim, not refunded by a retry


def test_one_attempt_row_per_applied_outcome_with_its_fields(store, lease, rows):
    rows.make_jobs(3)
    ok, retry, unroutable = claim(store, lease)
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            outcome(ok, return_value=[1, "two"], duration=1.5),
            outcome(
                retry,
                OutcomeKind.RETRY,
                retry_delay=5,
                error_class="builtins.ValueError",
                traceback="Traceback: boom",
                duration=0.25,
            ),
            outcome(unroutable, OutcomeKind.QUARANTINED, error_class="backwave.Unroutable", traceback="no such task"),
        ],
    )
    attempts = {a.job_id: a for a in rows.attempts()}
    assert len(attempts) == 3
    assert {pk: (a.number, a.state, a.worker_id) for pk, a in attempts.items()} == {
        ok.id: (1, "succeeded", lease.worker_id),
        retry.id: (1, "failed", lease.worker_id),
        unroutable.id: (1, "quarantined", lease.worker_id),
    }
    assert attempts[ok.id].return_value == [1, "two"]
    assert attempts[ok.id].started_at == ok.attempted_at
    assert attempts[ok.id].finished_at == ok.attempted_at + timedelta(seconds=1.5)
    assert attempts[retry.id].finished_at == retry.attempted_at + timedelta(seconds=0.25)
    assert (attempts[retry.id].error_class, attempts[retry.id].traceback) == ("builtins.ValueError", "Traceback: boom")
    assert attempts[retry.id].return_value is None
    assert attempts[unroutable.id].traceback == "no such task"


def test_a_task_returning_none_stores_json_null_not_sql_null(store, lease, rows):
    rows.make_jobs(2)
    ok, failed = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ok, return_value=None), outcome(failed, OutcomeKind.FAILED)])
    jobs, attempts = rows.sql_null_return_values()
    assert jobs == [(ok.id, False, True), (failed.id, True, None)]
    assert attempts == [(ok.id, False), (failed.id, True)]


def test_retry_is_due_after_the_delay_by_the_database_clock(store, lease, rows):
    rows.make_jobs(1, run_at=ago(3600))
    (job,) = claim(store, lease)
    before = rows.now()
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.RETRY, retry_delay=90)])
    after = rows.now()
    run_at = rows.job(job.id).run_at
    assert before + timedelta(seconds=90) <= run_at <= after + timedelta(seconds=90)
    assert claim(store, lease) == []  # not due yet


@pytest.mark.parametrize("kind", [OutcomeKind.RETRY, OutcomeKind.SNOOZED])
def test_a_retry_or_snooze_at_the_maximum_delay_is_written_as_one(store, lease, rows, kind):
    """The longest delay the driver hands over (MAX_DELAY) is a time every store holds."""
    from backwave.core.backoff import MAX_DELAY

    rows.make_jobs(1, max_attempts=3)
    (job,) = claim(store, lease)
    before = rows.now()
    applied = store.write_outcomes_many(
        lease_id=lease.id, outcomes=[outcome(job, kind, retry_delay=MAX_DELAY, error_class="app.Boom")]
    )
    assert applied == {job.id} and not applied.replaced
    stored = rows.job(job.id)
    assert stored.state == "ready"
    assert before + timedelta(seconds=MAX_DELAY) <= stored.run_at <= rows.now() + timedelta(seconds=MAX_DELAY)


def test_a_stale_writer_changes_nothing_while_valid_outcomes_in_the_batch_apply(store, lease, open_lease, rows):
    other = open_lease("host:2:default:0")
    rows.make_jobs(3)
    mine, wrong_attempt, theirs_claimed = claim(store, lease, limit=2) + claim(store, other, limit=1)
    stale = [
        outcome(mine),
        OutcomeRecord(job_id=wrong_attempt.id, attempt=wrong_attempt.attempt + 1, kind=OutcomeKind.SUCCEEDED),
        outcome(theirs_claimed),  # a job under another lease token
    ]
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=stale) == {mine.id}
    assert rows.states([wrong_attempt.id, theirs_claimed.id]) == {wrong_attempt.id: "running", theirs_claimed.id: "running"}
    assert [a.job_id for a in rows.attempts()] == [mine.id]


@pytest.mark.parametrize("how", ["expired", "deleted"])
def test_nothing_applies_once_the_lease_is_gone(store, lease, how, rows):
    rows.make_jobs(2)
    jobs = claim(store, lease)
    if how == "expired":
        rows.lapse(lease.id)  # lapsed by the database clock, maintenance has not run yet
    else:
        rows.delete_lease(lease.id)
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in jobs]) == set()
    assert set(rows.states(job.id for job in jobs).values()) == {"running"}
    assert rows.attempts() == []


def test_a_repeated_write_applies_once(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job)]) == {job.id}
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job)]) == set()
    assert len(rows.attempts()) == 1


def test_an_outcome_for_an_older_attempt_is_refused_after_a_reclaim(store, lease, rows):
    rows.make_jobs(1, max_attempts=3)
    (first,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(first, OutcomeKind.RETRY, retry_delay=0)])
    (second,) = claim(store, lease)
    assert second.attempt == 2
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(first)]) == set()
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(second)]) == {second.id}
    assert [(a.number, a.state) for a in rows.attempts()] == [(1, "failed"), (2, "succeeded")]


def test_an_empty_batch_costs_no_round_trip(store, lease):
    before = store.round_trips
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[]) == set()
    assert store.round_trips == before


def test_a_batch_is_one_round_trip(store, lease, rows):
    rows.make_jobs(50)
    jobs = claim(store, lease, limit=50)
    before = store.round_trips
    assert len(store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in jobs])) == 50
    assert store.round_trips == before + 1


def test_two_outcomes_for_one_job_are_refused_before_sending(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    before = store.round_trips
    with pytest.raises(ValueError, match=f"job {job.id} has two outcomes"):
        store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job), outcome(job, OutcomeKind.FAILED)])
    assert store.round_trips == before


# -- the second wall: a row whose data cannot be stored costs that row alone -----------------
#
# The attempt already makes a return value storable (backwave/shell/execution.py); these records
# are what it would have refused, handed to the store directly.


def _written_as_unstorable(rows, job_id, reason, state="failed"):
    (attempt,) = [a for a in rows.attempts() if a.job_id == job_id]
    assert (rows.job(job_id).state, attempt.state, attempt.error_class) == (state, "failed", "backwave.UnstorableResult")
    assert reason in attempt.traceback, attempt.traceback
    assert rows.job(job_id).return_value is None
    return attempt


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({1, 2}, "the return value is a set, which is not JSON-serialisable"),
        ({"name": "a\x00b"}, "the return value holds a NUL character at ['name']"),
        ({"rows": [1.0, float("nan")]}, "the return value holds NaN at ['rows'][1]"),
        (10**5000, "the return value is an int of 5,001 digits"),
    ],
    ids=["set", "nul", "nan", "huge_int"],
)
def test_a_value_json_cannot_encode_fails_that_job_alone_in_the_same_round_trip(store, lease, value, reason, rows):
    rows.make_jobs(3)
    before, bad, after = claim(store, lease)
    trips = store.round_trips

    applied = store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[outcome(before, return_value=1), outcome(bad, return_value=value), outcome(after, return_value=2)],
    )

    assert applied == {before.id, bad.id, after.id}
    assert store.round_trips == trips + 1  # found and replaced before anything was sent
    assert (rows.job(before.id).return_value, rows.job(after.id).return_value) == (1, 2)
    _written_as_unstorable(rows, bad.id, reason)
    assert "the task returned, but its return value cannot be stored" in applied.replaced[bad.id].traceback
    assert set(applied.replaced) == {bad.id}


def test_a_row_postgresql_refuses_is_isolated_by_bisection_and_the_rest_written(store, lease, rows):
    rows.make_jobs(8)
    jobs = claim(store, lease)
    bad = jobs[5]
    # A lone surrogate: json.dumps writes it as the escape \ud800, which jsonb refuses (22P02).
    outcomes = [outcome(job, return_value="\ud800" if job is bad else job.id) for job in jobs]
    trips = store.round_trips

    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=outcomes)

    assert applied == {job.id for job in jobs}
    # The batch (refused), then halves down to the row: [0:4] written, [4:8] refused, [4:6]
    # refused, [4] written, [5] refused and its replacement written, [6:8] written.
    assert store.round_trips == trips + 8
    assert {job.id: rows.job(job.id).return_value for job in jobs if job is not bad} == {
        job.id: job.id for job in jobs if job is not bad
    }
    _written_as_unstorable(rows, bad.id, "PostgreSQL refused it [22P02]")
    assert set(applied.replaced) == {bad.id}


def test_a_refused_row_keeps_the_claim_that_rode_on_the_write(store, lease, rows):
    rows.make_jobs(2)
    good, bad = claim(store, lease, limit=2)
    fresh = rows.make_jobs(3)

    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id,
        worker_id=lease.worker_id,
        queues=["default"],
        limit=3,
        outcomes=[outcome(good, return_value="ok"), outcome(bad, return_value=["\udc00"])],
    )

    assert applied == {good.id, bad.id}
    assert [job.id for job in claimed] == [job.pk for job in fresh]
    assert rows.job(good.id).return_value == "ok"
    _written_as_unstorable(rows, bad.id, "PostgreSQL refused it [22P02]")


def test_a_refused_retry_delay_fails_the_job_saying_why(store, lease, rows):
    rows.make_jobs(2, max_attempts=3)
    doomed, mate = claim(store, lease, limit=2)

    # A delay past timestamptz's range (22008): the replacement keeps the decision (and the
    # delay), is refused too, and the job fails instead.
    applied = store.write_outcomes_many(
        lease_id=lease.id, outcomes=[outcome(doomed, OutcomeKind.RETRY, retry_delay=1e300, error_class="app.Boom"), outcome(mate)]
    )

    assert applied == {doomed.id, mate.id}
    assert rows.job(mate.id).state == "succeeded"
    _written_as_unstorable(rows, doomed.id, "[22008]")
    assert applied.replaced[doomed.id].kind is OutcomeKind.FAILED


@pytest.mark.stores("postgres", "django")  # a trigger on the real table
def test_a_text_the_database_cannot_hold_is_written_escaped_and_the_retry_kept(store, lease, rows):
    rows.make_jobs(2, max_attempts=3)
    retry, mate = claim(store, lease, limit=2)
    # What a LATIN1 database answers for a character it has no equivalent for (22021).
    with connection.cursor() as cursor:
        cursor.execute(_REFUSE_NON_ASCII_TEXT)
    try:
        applied = store.write_outcomes_many(
            lease_id=lease.id,
            outcomes=[
                outcome(
                    retry, OutcomeKind.RETRY, retry_delay=0, error_class="app.Boom", traceback="app.Boom: no caf\u00e9 \U0001f600"
                ),
                outcome(mate),
            ],
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_non_ascii ON backwave_attempt; DROP FUNCTION refuse_non_ascii()")

    assert applied == {retry.id, mate.id}
    assert rows.job(mate.id).state == "succeeded"
    kept = _written_as_unstorable(rows, retry.id, "PostgreSQL refused it [22021]", state="ready")  # still a retry
    assert "app.Boom: no caf\\xe9 \\U0001f600" in kept.traceback  # the attempt's own error, escaped
    assert applied.replaced[retry.id].kind is OutcomeKind.RETRY


_REFUSE_NON_ASCII_TEXT = """
CREATE FUNCTION refuse_non_ascii() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.traceback ~ '[^[:ascii:]]' THEN
        RAISE EXCEPTION 'character has no equivalent in encoding "LATIN1"' USING ERRCODE = '22021';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_non_ascii BEFORE INSERT ON backwave_attempt FOR EACH ROW EXECUTE FUNCTION refuse_non_ascii();
"""


def test_a_lone_surrogate_in_an_error_text_is_stored_escaped(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    trips = store.round_trips
    applied = store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[outcome(job, OutcomeKind.FAILED, error_class="app.Bad\udce9Error", traceback="reading caf\udce9.csv")],
    )
    assert applied == {job.id} and not applied.replaced
    assert store.round_trips == trips + 1
    (attempt,) = rows.attempts()
    assert (attempt.error_class, attempt.traceback) == ("app.Bad\\udce9Error", "reading caf\\udce9.csv")


def test_an_error_class_is_cut_to_its_column(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.FAILED, error_class="app." + "E" * 400)])
    (attempt,) = rows.attempts()
    assert attempt.error_class == "…" + ("app." + "E" * 400)[-254:]  # 255 characters: the class's own name is kept


def test_a_nul_in_an_error_text_is_stored_escaped(store, lease, rows):
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    applied = store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[outcome(job, OutcomeKind.FAILED, error_class="app.Bad\x00Error", traceback="line 1\x00line 2")],
    )
    assert applied == {job.id}
    (attempt,) = rows.attempts()
    assert (attempt.error_class, attempt.traceback) == ("app.Bad\\x00Error", "line 1\\x00line 2")
    assert rows.job(job.id).return_value is None


# -- write_outcomes_then_claim ---------------------------------------------------------------


def test_write_then_claim_is_one_round_trip_and_claims_after_the_write(store, lease, rows):
    rows.make_jobs(4)
    done, retried, _, _ = claim(store, lease, limit=4)
    fresh = rows.make_jobs(2, run_at=ago(3600))
    before = store.round_trips

    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id,
        worker_id=lease.worker_id,
        queues=["default"],
        limit=4,
        outcomes=[outcome(done), outcome(retried, OutcomeKind.RETRY, retry_delay=0)],
    )

    assert store.round_trips == before + 1
    assert applied == {done.id, retried.id}
    # The claim saw the write: the finished job is not taken again, the retried one (due at
    # once) is, as its second attempt, and the pool-sized limit is met by what is really ready.
    assert [job.id for job in claimed] == [fresh[0].pk, fresh[1].pk, retried.id]
    assert {job.id: job.attempt for job in claimed}[retried.id] == 2
    # One implicit transaction, one Sync: both statements saw the same now().
    assert rows.job(done.id).finished_at == claimed[0].attempted_at


def test_write_then_claim_with_nothing_to_write_is_a_claim(store, lease, rows):
    rows.make_jobs(2)
    before = store.round_trips
    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[], queues=["default"], limit=5
    )
    assert (applied, len(claimed), store.round_trips) == (set(), 2, before + 1)


def test_write_then_claim_with_no_room_is_a_write(store, lease, rows):
    rows.make_jobs(2)
    (job,) = claim(store, lease, limit=1)
    before = store.round_trips
    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[outcome(job)], queues=["default"], limit=0
    )
    assert (applied, claimed, store.round_trips) == ({job.id}, [], before + 1)


def test_a_failed_write_stops_the_claim_and_the_error_propagates(store, lease, rows):
    rows.make_jobs(3)
    (job,) = claim(store, lease, limit=1)
    # An attempt row already logged for this attempt makes the write's INSERT violate the
    # unique (job_id, number) constraint.
    rows.add_attempt(job_id=job.id, number=job.attempt, state="failed", worker_id="someone")

    with pytest.raises(StoreError, match="23505"):
        store.write_outcomes_then_claim(
            lease_id=lease.id, worker_id=lease.worker_id, outcomes=[outcome(job)], queues=["default"], limit=5
        )

    assert rows.count("ready") == 2  # the claim never ran
    assert rows.states([job.id]) == {job.id: "running"}  # the write was rolled back
    # The claim statement was due to be prepared inside that aborted pipeline; the store
    # must not be left believing it exists on the server.
    assert len(claim(store, lease)) == 2


@pytest.mark.stores("postgres")  # breaks the claim statement itself
def test_a_failed_claim_rolls_the_write_back(store, lease, monkeypatch, rows):
    rows.make_jobs(2)
    (job,) = claim(store, lease, limit=1)
    monkeypatch.setitem(queries.QUERIES, "claim_jobs_one_queue", "SELECT 1 / (%(limit)s - %(limit)s)")

    with pytest.raises(StoreError, match="22012"):  # division_by_zero
        store.write_outcomes_then_claim(
            lease_id=lease.id, worker_id=lease.worker_id, outcomes=[outcome(job)], queues=["default"], limit=5
        )

    assert rows.states([job.id]) == {job.id: "running"}
    assert rows.attempts() == []

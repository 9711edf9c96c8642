"""Workflows in the store (every store kind): the dependent enqueue, the release in the outcome
statement, the failure policies, Job Output and tag deltas."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

from backwave.core.jobs import OutcomeKind
from backwave.store import operator
from backwave.store.contract import After, DependencyRefused, NewJob, OutcomeRecord
from backwave.store.enqueue import enqueue_jobs, insert_jobs
from backwave.store.postgres import PostgresStore

PAYLOAD = {"args": [], "kwargs": {}}


def new(after=(), **fields) -> NewJob:
    return NewJob(task_path="app.tasks.t", payload=PAYLOAD, max_attempts=1, after=tuple(after), **fields)


def claim(store, lease, limit=100):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


def outcome(job, kind=OutcomeKind.SUCCEEDED, **fields):
    return OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=kind, **fields)


def test_dependents_wait_and_roots_are_ready(store, rows):
    a, b, c = store.enqueue_many(
        [new(), new(after=[After(position=0)]), new(after=[After(position=0), After(position=1, on_failure="hold")])]
    )
    assert rows.states([a, b, c]) == {a: "ready", b: "waiting", c: "waiting"}
    assert (rows.job(b).waiting_on, rows.job(c).waiting_on) == (1, 2)
    d = store.enqueue_many([new(after=[After(job_id=c)])])[0]
    assert rows.job(d).waiting_on == 1


def test_an_unknown_ancestor_refuses_the_whole_batch(store, rows):
    (existing,) = store.enqueue_many([new()])
    with pytest.raises(DependencyRefused, match="job 987654321 does not exist") as refused:
        store.enqueue_many([new(), new(after=[After(job_id=existing), After(job_id=987654321)])])
    assert refused.value.refused == {987654321: None}
    assert rows.count() == 1


def test_the_last_ancestors_success_releases_the_dependent_in_the_same_statement(store, lease, rows):
    a, b, fan_in = store.enqueue_many([new(), new(), new(after=[After(position=0), After(position=1)])])
    first, second = claim(store, lease)
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(first)]).released == 0
    assert (rows.job(fan_in).state, rows.job(fan_in).waiting_on) == ("waiting", 1)
    before = store.round_trips
    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[outcome(second)], queues=["default"], limit=10
    )
    assert store.round_trips == before + 1
    assert (applied.released, [job.id for job in claimed]) == (1, [fan_in])  # claimed in that round-trip


@pytest.mark.stores("postgres")
def test_a_released_dependent_wakes_the_pumps_of_its_own_queue(store, lease, rows):
    """The ancestor runs on "default"; its dependent is on "reports", which the writing pump may not
    serve: the write that releases it sends that queue's wake-up hint, one however many it releases."""
    import psycopg
    from django.db import connection as django_connection

    listener = psycopg.connect(**{**django_connection.get_connection_params(), "autocommit": True})
    try:
        listener.execute("LISTEN backwave_hint")
        a, *_ = store.enqueue_many(
            [new(), new(after=[After(position=0)], queue="reports"), new(after=[After(position=0)], queue="reports")]
        )
        list(listener.notifies(timeout=0.2))  # the enqueue's own hint for "default"
        (job,) = claim(store, lease)
        assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job)]).released == 2
        heard = [n.payload for n in listener.notifies(timeout=1.0, stop_after=2)]
    finally:
        listener.close()
    assert heard == ["reports"]


@pytest.mark.parametrize("kind", [OutcomeKind.RETRY, OutcomeKind.SNOOZED])
def test_a_retry_or_a_snooze_settles_nothing(store, lease, rows, kind):
    a, b = store.enqueue_many([new(), new(after=[After(position=0)])])
    (job,) = claim(store, lease)
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, kind, retry_delay=0)])
    assert applied == {job.id} and applied.released == 0
    assert (rows.job(a).state, rows.job(b).state, rows.job(b).waiting_on) == ("ready", "waiting", 1)


@pytest.mark.parametrize("kind", [OutcomeKind.FAILED, OutcomeKind.QUARANTINED, OutcomeKind.CANCELLED])
def test_a_failed_ancestor_cancels_runs_or_holds_each_dependent_by_policy(store, lease, rows, kind):
    ids = store.enqueue_many(
        [
            new(),  # 0: the ancestor that fails
            new(after=[After(position=0)]),  # 1: cancelled
            new(after=[After(position=1)]),  # 2: cancelled in turn
            new(after=[After(position=1, on_failure="run")]),  # 3: runs anyway once 1 is cancelled
            new(after=[After(position=0, on_failure="run")]),  # 4: runs anyway
            new(after=[After(position=0, on_failure="hold")]),  # 5: held
            new(after=[After(position=5)]),  # 6: keeps waiting behind the held job
        ]
    )
    (ancestor,) = claim(store, lease)
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor, kind, error_class="x.E")])
    assert applied.released == 2  # 3 and 4
    states = rows.states(ids)
    assert [states[i] for i in ids] == [kind.value, "cancelled", "cancelled", "ready", "ready", "held", "waiting"]
    ended = "failed" if kind is OutcomeKind.FAILED else f"was {kind.value}"
    assert rows.job(ids[1]).reason == f"Cancelled: ancestor #{ids[0]} {ended}."
    assert rows.job(ids[2]).reason == f"Cancelled: ancestor #{ids[1]} was cancelled."
    assert rows.job(ids[5]).reason.startswith(f"Held: ancestor #{ids[0]} {ended}. Retry it to re-arm")
    assert rows.job(ids[1]).finished_at is not None


def test_output_merges_and_tag_deltas_apply_whatever_the_kind(store, lease, rows):
    a, b = store.enqueue_many([new(tags=["x", "y"]), new(tags=["keep"])])
    first, second = claim(store, lease)
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            outcome(
                first,
                OutcomeKind.RETRY,
                retry_delay=0,
                output={"rows": 1, "stage": "a"},
                tags_added=("z", "x"),
                tags_removed=("y",),
            ),
            outcome(second, OutcomeKind.FAILED, output={"why": "it broke"}, tags_added=("broken",)),
        ],
    )
    assert (rows.job(a).output, rows.job(a).tags) == ({"rows": 1, "stage": "a"}, ["x", "z"])
    assert (rows.job(b).output, rows.job(b).tags) == ({"why": "it broke"}, ["keep", "broken"])
    (again,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(again, output={"rows": 2})])
    assert rows.job(a).output == {"rows": 2, "stage": "a"}  # a later attempt's value of a name wins


def test_an_unstorable_output_costs_its_row_alone(store, lease, rows):
    a, b = store.enqueue_many([new(), new()])
    first, second = claim(store, lease)
    applied = store.write_outcomes_many(
        lease_id=lease.id, outcomes=[outcome(first, output={"bad": float("nan")}), outcome(second, output={"fine": 1})]
    )
    assert applied == {a, b}
    assert applied.replaced[a].kind is OutcomeKind.FAILED
    assert "its output cannot be stored: the output holds NaN at ['bad']" in applied.replaced[a].traceback
    assert (rows.job(a).state, rows.job(a).output) == ("failed", None)
    assert rows.job(b).output == {"fine": 1}


@pytest.mark.stores("postgres")
def test_releasing_a_fan_out_of_10000_is_one_statement(store, lease, rows):
    ids = store.enqueue_many([new(), *(new(after=[After(position=0)]) for _ in range(10_000))])
    (root,) = claim(store, lease, limit=1)
    # The point is the count of round-trips, not the time: on a cold CI server this one statement
    # took longer than the test store's statement timeout (57014), so it gets a minute here. A
    # worker's own timeout (WORKER_STATEMENT_TIMEOUT, 6 s) is the open problem noted for issue 11.
    sql, settings = store._transaction_settings
    store._transaction_settings = (sql, {**settings, "statement_timeout": "60000"})
    before = store.round_trips
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(root)])
    assert store.round_trips == before + 1
    assert applied.released == 10_000
    assert rows.count("ready") == 10_000 and rows.count("waiting") == 0


@contextmanager
def enqueuing() -> Iterator[psycopg.Cursor]:
    """An application's transaction on a session of its own, committed at the end of the block."""
    params = {**PostgresStore.from_django()._connect_params, "autocommit": False}
    with psycopg.connect(**params) as session, session.cursor() as cursor:
        yield cursor
        session.commit()


@pytest.mark.stores("postgres")
def test_an_ancestor_that_succeeds_while_the_enqueue_is_open_releases_its_dependent_at_the_commit(store, lease, rows):
    """The enqueue locks nothing the outcome write waits for (it writes at once, not busy); the
    dependent it could not see is settled when the enqueue commits."""
    (ancestor_id, other_id) = store.enqueue_many([new(), new()])
    ancestor, other = claim(store, lease)
    with enqueuing() as cursor:
        (dependent,) = insert_jobs(cursor, [new(after=[After(job_id=ancestor_id)])])
        applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor), outcome(other)])
        assert applied == {ancestor_id, other_id} and not applied.busy and applied.released == 0
        assert rows.states([dependent]) == {}  # not committed yet
    assert rows.states([ancestor_id, dependent]) == {ancestor_id: "succeeded", dependent: "ready"}
    assert rows.job(ancestor_id).has_dependents


@pytest.mark.stores("postgres")
def test_an_ancestor_that_fails_while_the_enqueue_is_open_cancels_its_dependents_at_the_commit(make_store, lease, rows):
    """Its dependent is cancelled, with its 'cancelled' transition for the observers the enqueue
    named, and the batch's own dependent of that dependent with it."""
    store = make_store()
    (ancestor_id,) = store.enqueue_many([new()])
    (ancestor,) = claim(store, lease)
    watched = json.dumps([{"kind": "cancelled", "task_path": None, "queue": None, "observer": "tests.watch"}])
    with enqueuing() as cursor:
        first, second, held = enqueue_jobs(
            cursor,
            [
                new(after=[After(job_id=ancestor_id)]),
                new(after=[After(position=0)]),
                new(after=[After(job_id=ancestor_id, on_failure="hold")]),
            ],
            observed=watched,
        )
        store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor, OutcomeKind.FAILED)])
    ids = [first.id, second.id, held.id]
    assert rows.states(ids) == {first.id: "cancelled", second.id: "cancelled", held.id: "held"}
    assert rows.job(first.id).reason == f"Cancelled: ancestor #{ancestor_id} failed."
    assert rows.job(second.id).reason == f"Cancelled: ancestor #{first.id} was cancelled."
    assert rows.job(held.id).reason.startswith(f"Held: ancestor #{ancestor_id} failed.")
    noted = {(t.job_id, t.kind, tuple(t.observers)) for t in rows.transitions()}
    assert noted == {(first.id, "cancelled", ("tests.watch",)), (second.id, "cancelled", ("tests.watch",))}


@pytest.mark.stores("postgres")
def test_an_outcome_whose_snapshot_is_older_than_the_enqueues_commit_is_busy_and_written_again(make_store, lease, rows):
    """The commit changed the ancestor's row after the write's snapshot was taken: the write
    passes it over rather than end it without seeing the dependent, and the next write settles
    it. The write is held between its snapshot and its job rows by a lock on its lease row (the
    first row it takes)."""
    store = make_store(lock_timeout=30)
    (ancestor_id,) = store.enqueue_many([new()])
    (ancestor,) = claim(store, lease)
    answers = []
    params = {**PostgresStore.from_django()._connect_params, "autocommit": False}
    with psycopg.connect(**params) as blocker:
        blocker.execute("SELECT id FROM backwave_lease WHERE id = %s FOR UPDATE", [lease.id])
        writer = threading.Thread(
            target=lambda: answers.append(store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor)]))
        )
        writer.start()
        wait_until_waiting(store.backend_pid)
        with enqueuing() as cursor:
            (dependent,) = insert_jobs(cursor, [new(after=[After(job_id=ancestor_id)])])
        blocker.rollback()
    writer.join(timeout=30)
    ((first,),) = [answers]
    assert first == set() and first.busy == {ancestor_id}
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor)])
    assert applied == {ancestor_id} and applied.released == 1
    assert rows.states([ancestor_id, dependent]) == {ancestor_id: "succeeded", dependent: "ready"}


def wait_until_waiting(pid: int) -> None:
    """Return once backend ``pid`` waits for a lock (pg_locks, read on a side connection)."""
    params = {**PostgresStore.from_django()._connect_params, "autocommit": True}
    with psycopg.connect(**params) as side:
        for _ in range(3000):
            if side.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid]).fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


def test_retention_keeps_an_ancestor_while_a_dependent_may_still_read_its_output(store, rows):
    ancestor = rows.finished_job("succeeded", seconds_ago=7200)
    unrelated = rows.finished_job("succeeded", seconds_ago=7200)
    (dependent,) = store.enqueue_many([new(after=[After(job_id=ancestor)])])
    assert rows.job(dependent).state == "ready"  # its ancestor had succeeded already
    assert store.purge_jobs(older_than=[("succeeded", 3600)], limit=100) == 1
    assert set(rows.states([ancestor, unrelated])) == {ancestor}


@pytest.mark.stores("postgres")
def test_the_stores_statements_run_without_jit():
    """A plan of the outcome write beside a wide fan-in passes jit_above_cost; compiling it took
    about half a second per execution (the fan-out benchmark at 12% of its baseline)."""
    from backwave.store.queries import QUERIES

    store = PostgresStore.from_django(statement_timeout=5, lock_timeout=1)
    QUERIES["probe_jit"] = "SELECT current_setting('jit')"
    try:
        assert store._execute("probe_jit", {}) == [("off",)]
    finally:
        del QUERIES["probe_jit"]
        store.close()


@pytest.mark.stores("postgres")
def test_the_stores_prepared_statements_are_planned_once(rows):
    """Each prepared statement gets one generic plan, never a custom plan per call: with
    statistics from an empty table PostgreSQL re-planned the outcome write (1.2 ms) and the
    claim (0.65 ms) on every call. Counted by the server for this connection."""
    from backwave.store.contract import OutcomeRecord
    from backwave.store.queries import QUERIES

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE backwave_job")
    rows.make_jobs(200)
    store = PostgresStore.from_django(statement_timeout=5, lock_timeout=1)
    lease_id = uuid.uuid4()
    store.open_lease(lease_id=lease_id, worker_id="w", group="g", hostname="h", pid=1, duration=60.0)
    jobs = store.claim_jobs(lease_id=lease_id, worker_id="w", queues=["default"], limit=10)
    for _ in range(12):
        _, jobs = store.write_outcomes_then_claim(
            lease_id=lease_id,
            worker_id="w",
            queues=["default"],
            limit=10,
            outcomes=[OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED) for job in jobs],
        )
    # The settings statement itself is planned before its set_config runs (by the session's
    # setting, custom for its first five calls): a SELECT of constants, left out here.
    QUERIES["probe_plans"] = (
        "SELECT coalesce(sum(custom_plans), 0), coalesce(sum(generic_plans), 0) FROM pg_prepared_statements"
        " WHERE statement NOT LIKE 'SELECT CASE WHEN%%set_config%%'"
    )
    try:
        ((custom, generic),) = store._execute("probe_plans", {})
    finally:
        del QUERIES["probe_plans"]
        store.close()
    assert custom == 0 and generic > 0, (custom, generic)


def _statements_sent(store, monkeypatch) -> list[list[str]]:
    """The names of the statements of each round-trip the store makes from now on."""
    sent: list[list[str]] = []
    pipeline = store._pipeline

    def recording(operation, statements):
        sent.append([name for name, _ in statements])
        return pipeline(operation, statements)

    monkeypatch.setattr(store, "_pipeline", recording)
    return sent


@pytest.mark.stores("postgres")
def test_the_outcomes_of_jobs_nobody_waits_for_are_written_without_a_lock_or_settling(store, lease, rows, monkeypatch):
    """The settling CTEs cost a batch of plain jobs a probe of the dependency table per ended job (15 us a job of the server's time in the throughput
    benchmark): a batch none of whose jobs had dependents when claimed is one plain statement."""
    store.enqueue_many([new(), new(), new()])
    jobs = claim(store, lease)
    sent = _statements_sent(store, monkeypatch)
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in jobs])
    assert applied == {job.id for job in jobs}
    assert [[name for name in trip if name != "set_transaction_settings"] for trip in sent] == [["write_outcomes_plain"]]
    assert set(rows.states([job.id for job in jobs]).values()) == {"succeeded"}


@pytest.mark.stores("postgres")
def test_an_ancestor_claimed_with_its_dependents_is_written_by_the_settling_write(store, lease, rows, monkeypatch):
    (ancestor_id, dependent_id) = store.enqueue_many([new(), new(after=[After(position=0)])])
    (ancestor,) = claim(store, lease)
    sent = _statements_sent(store, monkeypatch)
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor)])
    assert applied == {ancestor_id} and applied.released == 1
    assert [[name for name in trip if name != "set_transaction_settings"] for trip in sent] == [["write_outcomes_many"]]
    assert rows.states([ancestor_id, dependent_id]) == {ancestor_id: "succeeded", dependent_id: "ready"}


@pytest.mark.stores("postgres")
def test_a_dependent_enqueued_while_its_ancestor_ran_is_released_by_a_second_write(store, lease, rows, monkeypatch):
    """The ancestor had no dependent when claimed, so its outcome goes out plain; the enqueue
    flagged it meanwhile, the plain write's fence leaves it, and the settling write applies it."""
    (ancestor_id, other_id) = store.enqueue_many([new(), new()])
    ancestor, other = claim(store, lease)
    (dependent_id,) = store.enqueue_many([new(after=[After(job_id=ancestor_id)])])
    sent = _statements_sent(store, monkeypatch)
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ancestor), outcome(other)])
    assert applied == {ancestor_id, other_id} and applied.released == 1
    assert [[name for name in trip if name != "set_transaction_settings"] for trip in sent] == [
        ["write_outcomes_plain"],
        ["write_outcomes_many"],
    ]
    assert rows.states([ancestor_id, other_id, dependent_id]) == {
        ancestor_id: "succeeded",
        other_id: "succeeded",
        dependent_id: "ready",
    }


@pytest.mark.stores("postgres")
def test_a_refused_plain_outcome_is_refused_again_by_the_settling_write(store, lease, rows):
    """The second write only ever applies what the plain one's has_dependents check left: an
    outcome the fence refuses (another attempt's) stays refused."""
    store.enqueue_many([new()])
    (job,) = claim(store, lease)
    stale = OutcomeRecord(job_id=job.id, attempt=job.attempt + 1, kind=OutcomeKind.SUCCEEDED)
    applied = store.write_outcomes_many(lease_id=lease.id, outcomes=[stale])
    assert applied == set()
    assert rows.states([job.id]) == {job.id: "running"}


def _session():
    """A session of its own, as an application process has: its plan cache is its own."""
    return psycopg.connect(**{**connection.get_connection_params(), "autocommit": True})


def _sequential_reads_of_jobs(session) -> tuple[int, int]:
    """(sequential scans, tuples they read) of backwave_job so far, this session's included."""
    session.execute("SELECT pg_stat_force_next_flush()")  # flushed as the session goes idle
    return session.execute("SELECT seq_scan, seq_tup_read FROM pg_stat_user_tables WHERE relname = 'backwave_job'").fetchone()


@pytest.mark.django_db(transaction=True)
def test_a_wide_fan_in_checks_its_edges_by_index_whatever_the_session_planned_before():
    """Each edge's foreign keys are checked by a lookup of backwave_job that PostgreSQL plans once
    per session and keeps. Planned while the table was one page (just emptied and vacuumed, a
    first small workflow), it was a sequential scan, and every edge of a later fan-in scanned
    the whole table: 20,000 + 1 took 50 s to enqueue instead of 2."""
    fan_in = 1000
    with _session() as session:
        session.execute("DELETE FROM backwave_job")
        session.execute("VACUUM ANALYZE backwave_job")
        with session.transaction(), session.cursor() as cursor:
            insert_jobs(cursor, [new(), *(new(after=[After(position=0)]) for _ in range(8))])
        scans, tuples = _sequential_reads_of_jobs(session)
        with session.transaction(), session.cursor() as cursor:
            insert_jobs(cursor, [*(new() for _ in range(fan_in)), new(after=[After(position=n) for n in range(fan_in)])])
        after_scans, after_tuples = _sequential_reads_of_jobs(session)
    # The statement's own plan may scan the nine rows there were (and another session's count
    # may land meanwhile); one scan per edge is 2,000 scans and a million tuples.
    scans, tuples = after_scans - scans, after_tuples - tuples
    assert scans < 10 and tuples < fan_in, (
        f"enqueueing a fan-in of {fan_in} read backwave_job by {scans} sequential scans ({tuples} tuples)"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("callers", ["on", "off"])
def test_an_enqueue_with_dependencies_leaves_the_callers_transaction_its_own_planner_setting(callers):
    """The statement turns enable_seqscan off for its own checks; the caller's next statement,
    in the same transaction, plans with the caller's value, after a refused batch too."""
    with _session() as session, session.cursor() as cursor:
        (root,) = insert_jobs(cursor, [new()])
        with session.transaction():
            cursor.execute("SELECT set_config('enable_seqscan', %s, true)", [callers])
            insert_jobs(cursor, [new(after=[After(job_id=root)]), new(after=[After(position=0)])])
            assert cursor.execute("SELECT current_setting('enable_seqscan')").fetchone() == (callers,)
            with pytest.raises(DependencyRefused):
                insert_jobs(cursor, [new(after=[After(job_id=987654321)])])
            assert cursor.execute("SELECT current_setting('enable_seqscan')").fetchone() == (callers,)
        assert cursor.execute("SELECT current_setting('enable_seqscan')").fetchone() == ("on",)


@pytest.mark.stores("django")
def test_the_test_pumps_store_leaves_the_tests_transaction_its_planner_setting(store):
    store.enqueue_many([new(), new(after=[After(position=0)])])
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_seqscan')")
        assert cursor.fetchone() == ("on",)


@pytest.mark.django_db(transaction=True)
def test_the_edges_keys_are_checked_when_their_statement_ends_and_cascade():
    """Not deferred to COMMIT (migration 0017): the checks are planned inside the enqueue
    statement, under its planner setting. Django rebuilds a key it alters as deferrable."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname, c.condeferrable, c.condeferred, c.confdeltype FROM pg_constraint AS c"
            " JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)"
            " WHERE c.conrelid = 'backwave_dependency'::regclass AND c.confrelid = 'backwave_job'::regclass"
            " AND c.contype = 'f' ORDER BY a.attname"
        )
        assert cursor.fetchall() == [("ancestor_id", False, False, "c"), ("job_id", False, False, "c")]
    with _session() as session, session.cursor() as cursor:
        first, middle, last = insert_jobs(cursor, [new(), new(after=[After(position=0)]), new(after=[After(position=1)])])
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            cursor.execute(
                "INSERT INTO backwave_dependency (job_id, ancestor_id, on_failure, position) VALUES (%s, 987654321, 'run', 1)",
                [last],
            )
        cursor.execute("DELETE FROM backwave_job WHERE id = %s", [middle])  # a purge's delete: its edges both ways go
        assert cursor.execute("SELECT job_id, ancestor_id FROM backwave_dependency").fetchall() == []


@pytest.mark.django_db(transaction=True)
def test_a_purge_deletes_dependency_rows_by_index_whatever_the_session_planned_before():
    """A purged job's dependency rows go by ON DELETE CASCADE: lookups PostgreSQL plans once per
    session and keeps, as it keeps the key checks above. Kept from the session's first purge,
    while the table held a handful of rows, they were sequential scans, and every job of a
    later purge scanned the dependency table whole, twice (once by each key)."""
    with _session() as session:
        session.execute("DELETE FROM backwave_job")
        session.execute("VACUUM ANALYZE backwave_job, backwave_dependency")
        finished = ["succeeded"]
        selection = ("SELECT id FROM backwave_job WHERE state = %s", ["succeeded"])
        with session.cursor() as cursor:
            insert_jobs(cursor, [new(), *(new(after=[After(position=0)]) for _ in range(9))])
            cursor.execute("UPDATE backwave_job SET state = 'succeeded'")
            assert len(operator.act_on_jobs(cursor, "purge", selection, finished)) == 10  # the session's first purge
            fan_in = 1000
            insert_jobs(cursor, [*(new() for _ in range(fan_in)), new(after=[After(position=n) for n in range(fan_in)])])
            cursor.execute(
                "UPDATE backwave_job SET state = 'succeeded' WHERE id IN (SELECT id FROM backwave_job ORDER BY id LIMIT 200)"
            )
            with session.transaction():
                purged = operator.act_on_jobs(cursor, "purge", selection, finished)
                scans = cursor.execute(
                    "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'backwave_dependency'"
                ).fetchone()[0]
                assert cursor.execute("SELECT current_setting('enable_seqscan')").fetchone() == ("on",)  # the caller's, back
    assert len(purged) == 200 and all(changed for _id, _state, changed, _path in purged)
    assert scans < 5, f"purging 200 jobs read backwave_dependency by {scans} sequential scans"

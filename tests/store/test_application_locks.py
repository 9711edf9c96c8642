"""What an application's open transaction holds against the engine.

An enqueue runs in the caller's transaction, which may stay open for as long as the caller likes
(a long ``atomic()`` in a view or a script). Whatever it locks stays locked until then, so an
enqueue must lock nothing the engine writes: a running job's row above all, which the pump's
outcome write, its heartbeat and lease expiry all update. Each test holds such a transaction
open on a session of its own (an application process) while the store under test, with a short
lock timeout, does the engine's part: any wait for the application's lock would end in a lock
timeout instead of an answer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import NewJob, OutcomeRecord, ProgressReport
from backwave.store.enqueue import enqueue_jobs
from backwave.store.postgres import PostgresStore

pytestmark = pytest.mark.stores("postgres")

QUEUE = "default"
IN_FLIGHT = ("ready", "running")


def unique(number: int = 1, *, states=IN_FLIGHT, replace=(), **fields) -> NewJob:
    return NewJob(
        task_path="tests.t",
        payload={"args": [number], "kwargs": {}},
        unique_key="k",
        unique_states=states,
        unique_replace=replace,
        **fields,
    )


@pytest.fixture
def engine(make_store):
    """The engine's store, waiting at most 0.3 s for a lock (a worker's is 2 s by default)."""
    return make_store(lock_timeout=0.3)


@contextmanager
def application() -> Iterator[psycopg.Cursor]:
    """An application's transaction on a session of its own, rolled back at the end."""
    params = {**PostgresStore.from_django()._connect_params, "autocommit": False}
    with psycopg.connect(**params) as session, session.cursor() as cursor:
        yield cursor
        session.rollback()


def locked_against_update(job_id: int) -> bool:
    """Whether some other transaction holds a lock on the job's row that FOR UPDATE waits for
    (any row lock: FOR KEY SHARE included)."""
    params = {**PostgresStore.from_django()._connect_params, "autocommit": True}
    with psycopg.connect(**params) as probe:
        try:
            probe.execute("SELECT id FROM backwave_job WHERE id = %s FOR UPDATE NOWAIT", [job_id])
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=limit)


def test_a_duplicate_of_a_running_job_held_open_locks_nothing_the_engine_writes(engine, lease, rows):
    (job_id,) = engine.enqueue_many([unique()])
    (job,) = claim(engine, lease)
    with application() as cursor:
        (duplicate,) = enqueue_jobs(cursor, [unique(2, replace=("args", "run_at"))])
        assert duplicate.duplicate and duplicate.id == job_id and duplicate.state == "running"
        heartbeat = engine.heartbeat(
            lease_id=lease.id, duration=60, progress=[ProgressReport(job_id=job_id, attempt=job.attempt, progress=1)]
        )
        assert heartbeat.held
        applied = engine.write_outcomes_many(
            lease_id=lease.id, outcomes=[OutcomeRecord(job_id=job_id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED)]
        )
        assert applied == {job_id}
        assert not locked_against_update(job_id)
    assert rows.job(job_id).state == "succeeded"
    assert rows.job(job_id).payload == {"args": [1], "kwargs": {}}  # a running job is left alone


def test_a_duplicate_that_replaces_locks_the_ready_job_alone_and_the_claim_passes_it_over(engine, lease, rows):
    (job_id, other_id) = engine.enqueue_many(
        [unique(states=("ready",)), NewJob(task_path="tests.o", payload={"args": [], "kwargs": {}})]
    )
    with application() as cursor:
        (duplicate,) = enqueue_jobs(cursor, [unique(2, states=("ready",), replace=("args",))])
        assert duplicate.duplicate and duplicate.payload == {"args": [2], "kwargs": {}}
        assert [job.id for job in claim(engine, lease)] == [other_id]  # not a wait: passed over
        cursor.connection.commit()
    assert rows.job(job_id).payload == {"args": [2], "kwargs": {}}
    assert [job.id for job in claim(engine, lease)] == [job_id]


def test_a_duplicate_without_anything_to_replace_locks_not_even_a_ready_job(engine, lease, rows):
    (job_id,) = engine.enqueue_many([unique()])
    with application() as cursor:
        (duplicate,) = enqueue_jobs(cursor, [unique(2)])
        assert duplicate.duplicate and duplicate.id == job_id
        assert not locked_against_update(job_id)
        assert [job.id for job in claim(engine, lease)] == [job_id]


def test_a_key_taken_while_the_insert_waited_is_found_by_a_second_statement(engine, lease, rows):
    """The insert waits for a transaction that holds the key; once that one commits, this
    statement's snapshot (older) does not see its job: the key is sent again and found."""
    with application() as first:
        (held,) = enqueue_jobs(first, [unique()])
        answers = []
        with application() as second:
            waiter = threading.Thread(target=lambda: answers.append(enqueue_jobs(second, [unique(2)])))
            waiter.start()
            waiter.join(timeout=0.5)
            assert waiter.is_alive()  # the insert waits for the first transaction
            first.connection.commit()
            waiter.join(timeout=10)
            assert not waiter.is_alive()
    ((duplicate,),) = answers
    assert duplicate.duplicate and duplicate.id == held.id and duplicate.state == "ready"


def test_a_ready_job_claimed_under_a_replacing_duplicate_is_left_alone(engine, lease, rows):
    """The replacement finds the job it read as ready claimed since (by a claim committing while
    the insert waited for it): the key is sent again, and the running job is the duplicate's."""
    (job_id,) = engine.enqueue_many([unique()])
    params = {**PostgresStore.from_django()._connect_params, "autocommit": False}
    with psycopg.connect(**params) as claimer:
        claiming = PostgresStore.from_django()
        claiming._conn.close()
        claiming._conn = claimer  # the claim's transaction stays open until committed below
        (job,) = claim(claiming, lease)
        answers = []
        with application() as cursor:
            waiter = threading.Thread(target=lambda: answers.append(enqueue_jobs(cursor, [unique(2, replace=("args",))])))
            waiter.start()
            waiter.join(timeout=0.5)
            assert waiter.is_alive()  # the insert waits for the claim's transaction
            claimer.commit()
            waiter.join(timeout=10)
            assert not waiter.is_alive()
            ((duplicate,),) = answers
            assert duplicate.duplicate and duplicate.id == job_id and duplicate.state == "running"
            assert duplicate.payload == {"args": [1], "kwargs": {}}
    assert rows.job(job_id).payload == {"args": [1], "kwargs": {}}

"""An atomic task's outcome, written on its handler's Django connection inside the handler's
transaction (backwave/store/in_transaction.py), against the real PostgreSQL: the statements it
sends, and how PostgreSQL plans them on a connection that is not the worker's store."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import NOTHING_OBSERVED, After, NewJob, OutcomeRecord
from backwave.store.in_transaction import prepares_atomic_writes, write_outcome
from backwave.store.postgres import PostgresStore

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"args": [], "kwargs": {}}


def new(after=()) -> NewJob:
    return NewJob(task_path="app.tasks.t", payload=PAYLOAD, max_attempts=1, after=tuple(after))


@pytest.fixture
def store():
    store = PostgresStore.from_django()
    yield store
    store.close()


@pytest.fixture
def lease_id(store) -> uuid.UUID:
    lease_id = uuid.uuid4()
    store.open_lease(lease_id=lease_id, worker_id="w", group="default", hostname="host", pid=1, duration=60.0)
    return lease_id


def claim(store, lease_id, limit=100):
    return store.claim_jobs(lease_id=lease_id, worker_id="w", queues=["default"], limit=limit)


def succeeded(job) -> OutcomeRecord:
    return OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED, return_value=1)


def write_atomically(store, lease_id, job):
    """What the pump's Commit does for ``job``, in a transaction of the test's Django connection
    (whose OPTIONS leave prepare_threshold unset: Django's default, preparation off)."""
    with transaction.atomic():
        connection.ensure_connection()
        return write_outcome(
            connection.connection,
            lease_id=lease_id,
            record=succeeded(job),
            observed=NOTHING_OBSERVED,
            plain=not store.claimed_with_dependents(job.id),
            prepare=prepares_atomic_writes(connection.settings_dict),
        )


def prepared() -> list[tuple[str, int, int]]:
    """This session's prepared statements that touch the job table: (text, generic plans, custom plans)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%backwave_job%%' ORDER BY prepare_time"
        )
        return cursor.fetchall()


def test_every_atomic_write_is_prepared_and_runs_a_generic_plan_under_djangos_default(store, lease_id):
    """Django turns preparation off unless OPTIONS name a prepare_threshold, and the worker's
    store prepares anyway under that default: so do the atomic writes, or each is planned afresh
    on every job (about 1 ms of planning for the outcome statement). The handler's connection
    has none of the worker's planner settings either, and PostgreSQL plans a prepared
    statement's first five runs afresh: the write sets them for itself."""
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is None  # Django's default, as a project has it
    jobs = store.enqueue_many([new() for _ in range(12)])
    claimed = claim(store, lease_id)
    assert len(claimed) == len(jobs)
    store.enqueue_many([new(after=[After(job_id=job_id)]) for job_id in jobs[:6]])  # half of them are ancestors now

    for job in claimed:
        assert job.id in write_atomically(store, lease_id, job)

    statements = prepared()
    assert statements, "write_outcome prepared no statement"
    assert all(custom == 0 and generic > 0 for _text, generic, custom in statements), [
        (generic, custom) for _text, generic, custom in statements
    ]


def test_a_job_nobody_waits_for_is_written_by_the_plain_write_alone(store, lease_id):
    """As the batch path writes it: no lock_outcome_jobs and no settling (measured by
    pg_stat_statements in bench/atomic.py, unprepared: 1.6 ms for the settling write of one job
    and 0.5 ms for its lock, each planned afresh on every job)."""
    (job,) = store.enqueue_many([new()])
    (claimed,) = claim(store, lease_id)

    assert claimed.id in write_atomically(store, lease_id, claimed)

    texts = [text for text, _generic, _custom in prepared()]
    assert len(texts) == 1, texts  # no lock_outcome_jobs, no settling write
    assert "dep_released" not in texts[0]
    assert texts[0].count("FOR NO KEY UPDATE") == texts[0].count("SKIP LOCKED") == 1  # it waits for no job row


def test_an_ancestor_is_written_by_the_settling_write_and_releases_its_dependent(store, lease_id):
    (ancestor,) = store.enqueue_many([new()])
    (dependent,) = store.enqueue_many([new(after=[After(job_id=ancestor)])])
    (claimed,) = claim(store, lease_id)
    assert store.claimed_with_dependents(claimed.id)

    applied = write_atomically(store, lease_id, claimed)

    assert claimed.id in applied and applied.released == 1
    assert [job.id for job in claim(store, lease_id)] == [dependent]


def test_a_dependent_enqueued_while_the_ancestor_ran_is_released_by_the_settling_write_that_follows(store, lease_id):
    """Claimed with no dependent, given one while it runs: the plain write's fence (NOT
    has_dependents) leaves the outcome, and the settling write in the same transaction applies
    it and releases the dependent."""
    (ancestor,) = store.enqueue_many([new()])
    (claimed,) = claim(store, lease_id)
    assert not store.claimed_with_dependents(claimed.id)
    (dependent,) = store.enqueue_many([new(after=[After(job_id=ancestor)])])

    applied = write_atomically(store, lease_id, claimed)

    assert claimed.id in applied and applied.released == 1
    assert [job.id for job in claim(store, lease_id)] == [dependent]


def test_a_refused_outcome_is_refused_by_both_writes(store, lease_id):
    (job,) = store.enqueue_many([new()])
    (claimed,) = claim(store, lease_id)
    other = uuid.uuid4()
    store.open_lease(lease_id=other, worker_id="x", group="default", hostname="host", pid=2, duration=60.0)

    assert not write_atomically(store, other, claimed)  # not this lease's job
    assert claimed.id in write_atomically(store, lease_id, claimed)


def test_the_applications_own_queries_on_that_connection_stay_unprepared(store, lease_id):
    """The threshold is lifted for the atomic write's statements only: an application behind a
    pooler relies on Django's default for everything else it sends."""
    (job,) = store.enqueue_many([new()])
    (claimed,) = claim(store, lease_id)
    assert claimed.id in write_atomically(store, lease_id, claimed)
    written = prepared()

    assert connection.connection.prepare_threshold is None
    for _ in range(10):
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM backwave_job WHERE state = %s", ["succeeded"])
    assert prepared() == written


def test_a_project_that_sets_prepare_threshold_none_gets_nothing_prepared(store, lease_id):
    """Behind a PgBouncer that cannot keep prepared statements the README says to set it to
    None: the store then prepares nothing, and neither does the atomic write."""
    assert prepares_atomic_writes({"OPTIONS": {}}) and prepares_atomic_writes({})
    assert not prepares_atomic_writes({"OPTIONS": {"prepare_threshold": None}})
    assert not prepares_atomic_writes({"OPTIONS": {"prepare_threshold": 5}})  # psycopg prepares them itself
    (job,) = store.enqueue_many([new()])
    (claimed,) = claim(store, lease_id)
    before = prepared()

    with transaction.atomic():
        connection.ensure_connection()
        applied = write_outcome(
            connection.connection,
            lease_id=lease_id,
            record=succeeded(claimed),
            observed=NOTHING_OBSERVED,
            plain=True,
            prepare=prepares_atomic_writes({"OPTIONS": {"prepare_threshold": None}}),
        )

    assert claimed.id in applied
    assert prepared() == before

"""The observer loop's pass (claim, deliver in the attempt scope, settle) on the in-memory store."""

from __future__ import annotations

import uuid

import pytest

from backwave.core.deliveries import DeliveryOptions
from backwave.core.jobs import OutcomeKind
from backwave.observers import ObserverRegistry, observe
from backwave.shell.observers import ObserverLoop
from backwave.store.contract import OutcomeRecord
from backwave.testing.memory_store import InMemoryStore, MemoryDatabase

SEEN: list[tuple[int, str, int]] = []
FAILING = {"left": 0}
SCOPES: list[str] = []


def seen(transition):
    SEEN.append((transition.job_id, transition.kind, transition.delivery))


def sometimes_fails(transition):
    if FAILING["left"]:
        FAILING["left"] -= 1
        raise RuntimeError("not now")


@pytest.fixture(autouse=True)
def observers_that_do_not_fail():
    FAILING["left"] = 0


REGISTRY = ObserverRegistry([observe("succeeded", "retried")(seen), observe("succeeded")(sometimes_fails)])


def finished_jobs(database: MemoryDatabase, kinds):
    store = InMemoryStore(database)
    store.observed = REGISTRY.observed
    lease = uuid.uuid4()
    store.open_lease(lease_id=lease, worker_id="w", group="g", hostname="h", pid=1, duration=60)
    for _ in kinds:
        database.insert_job(task_path="app.tasks.t", queue="default", priority=0, max_attempts=3, backoff_base=1, backoff_max=1)
    jobs = store.claim_jobs(lease_id=lease, worker_id="w", queues=["default"], limit=len(kinds))
    store.write_outcomes_many(
        lease_id=lease, outcomes=[OutcomeRecord(job_id=j.id, attempt=1, kind=k, retry_delay=1) for j, k in zip(jobs, kinds)]
    )
    return [j.id for j in jobs]


def loop_on(database: MemoryDatabase, **options) -> ObserverLoop:
    SEEN.clear()
    SCOPES.clear()
    return ObserverLoop(
        store_factory=lambda: InMemoryStore(database),
        registry=REGISTRY,
        options=DeliveryOptions(backoff_base=0, backoff_max=0, **options),
        enter=lambda: SCOPES.append("enter"),
        leave=lambda: SCOPES.append("leave"),
    )


def test_a_pass_delivers_each_transition_to_its_observers_each_in_its_own_scope():
    database = MemoryDatabase()
    ok, retried = finished_jobs(database, [OutcomeKind.SUCCEEDED, OutcomeKind.RETRY])
    loop = loop_on(database)
    assert loop.run_once() == 2
    assert sorted(SEEN) == sorted([(ok, "succeeded", 1), (retried, "retried", 1)])
    assert SCOPES == ["enter", "leave"] * 3  # two observers of the success, one of the retry
    assert (loop.delivered, loop.failed, database.transitions) == (2, 0, {})
    assert loop.run_once() == 0 and loop.idle


def test_a_failed_observer_is_tried_again_without_rerunning_the_ones_that_ran():
    database = MemoryDatabase()
    (ok,) = finished_jobs(database, [OutcomeKind.SUCCEEDED])
    FAILING["left"] = 1
    loop = loop_on(database, max_deliveries=2)
    loop.run_once()
    assert (loop.delivered, loop.failed) == (0, 1)
    (row,) = database.transitions.values()
    assert row.failed_observer.endswith("sometimes_fails") and "RuntimeError: not now" in row.last_error
    assert row.delivered_to == ["tests.shell.test_observer_loop.seen"]  # ran before it, in name order
    loop.run_once()
    assert SEEN == [(ok, "succeeded", 1)]  # not again on the second try
    assert loop.delivered == 1 and not database.transitions


def test_an_observer_that_keeps_failing_leaves_its_transition_dead():
    database = MemoryDatabase()
    finished_jobs(database, [OutcomeKind.SUCCEEDED])
    FAILING["left"] = 5
    loop = loop_on(database, max_deliveries=2)
    loop.run_once()
    loop.run_once()
    (row,) = database.transitions.values()
    assert (row.state, row.deliveries) == ("dead", 2)
    assert loop.run_once() == 0

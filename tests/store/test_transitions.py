"""The durable record of applied transitions (backwave_transition), on every store kind: noted
by the statement that applies the outcome for watched transitions only, never for one the fence
refused; claimed with a token and a lease; settled (deleted, retried, dead), fenced by the token."""

from __future__ import annotations

import json
import uuid

import pytest

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import After, DeliveryResult, NewJob, OutcomeRecord

WATCH_ALL = json.dumps(
    [{"kind": kind, "task_path": None, "queue": None} for kind in ("succeeded", "failed", "retried", "quarantined", "lapsed")]
)


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


def outcome(job, kind=OutcomeKind.SUCCEEDED, **fields):
    return OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=kind, **fields)


def noted(rows):
    return sorted((t.job_id, t.attempt, t.kind) for t in rows.transitions())


def test_nothing_is_noted_while_nothing_is_observed(store, lease, rows):
    rows.make_jobs(2)
    ok, failed = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ok), outcome(failed, OutcomeKind.FAILED)])
    assert rows.transitions() == []


def test_each_applied_outcome_is_noted_with_its_kind(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(4)
    ok, retry, dead, unroutable = claim(store, lease)
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            outcome(ok, return_value=1),
            outcome(retry, OutcomeKind.RETRY, retry_delay=5),
            outcome(dead, OutcomeKind.FAILED),
            outcome(unroutable, OutcomeKind.QUARANTINED),
        ],
    )
    assert noted(rows) == sorted(
        [(ok.id, 1, "succeeded"), (retry.id, 1, "retried"), (dead.id, 1, "failed"), (unroutable.id, 1, "quarantined")]
    )
    assert {(t.state, t.deliveries, tuple(t.delivered_to), t.task_path, t.queue) for t in rows.transitions()} == {
        ("pending", 0, (), ok.task_path, "default")
    }


def test_an_outcome_the_fence_refuses_is_never_noted(store, lease, open_lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(2)
    kept, lost = claim(store, lease)
    rows.lapse(lease.id)
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(kept), outcome(lost)]) == set()
    assert rows.transitions() == []
    # ... and a write by a lease that never held the job neither.
    other = open_lease("host:2:default:0")
    assert (
        store.write_outcomes_then_claim(
            lease_id=other.id, worker_id=other.worker_id, outcomes=[outcome(kept)], queues=["default"], limit=0
        )[0]
        == set()
    )
    assert rows.transitions() == []


def test_the_write_that_rides_a_claim_notes_its_outcomes_too(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(2)
    (first,) = claim(store, lease, limit=1)
    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=[outcome(first)], queues=["default"], limit=1
    )
    assert applied == {first.id} and len(claimed) == 1
    assert noted(rows) == [(first.id, 1, "succeeded")]


def test_only_the_watched_kinds_tasks_and_queues_are_noted(store, lease, rows):
    watched_task = "tests.store.watched"
    store.observed = json.dumps(
        [
            {"kind": "failed", "task_path": None, "queue": None},
            {"kind": "succeeded", "task_path": watched_task, "queue": None},
            {"kind": "retried", "task_path": None, "queue": "emails"},
        ]
    )
    rows.make_jobs(1, task_path=watched_task)
    rows.make_jobs(3)
    jobs = claim(store, lease)
    watched = next(job for job in jobs if job.task_path == watched_task)
    others = [job for job in jobs if job is not watched]
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            outcome(watched),
            outcome(others[0]),
            outcome(others[1], OutcomeKind.FAILED),
            outcome(others[2], OutcomeKind.RETRY, retry_delay=1),
        ],
    )
    assert noted(rows) == sorted([(watched.id, 1, "succeeded"), (others[1].id, 1, "failed")])


def test_an_unstorable_success_is_noted_as_the_failure_that_was_written(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(1)
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, return_value=float("nan"))])
    assert noted(rows) == [(job.id, 1, "failed")]


def test_expiry_notes_a_lapsed_transition_per_released_job(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(2)
    jobs = claim(store, lease)
    rows.lapse(lease.id)
    assert store.expire_leases(limit=10) == 2
    assert noted(rows) == sorted((job.id, 1, "lapsed") for job in jobs)


def test_a_claim_stamps_its_token_and_hides_the_rows_from_other_claimers(store, make_store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(3)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in claim(store, lease)])
    other = make_store()
    mine = store.claim_transitions(token=uuid.uuid4(), limit=2, lease=60)
    theirs = other.claim_transitions(token=uuid.uuid4(), limit=10, lease=60)
    assert len(mine) == 2 and len(theirs) == 1
    assert {t.id for t in mine}.isdisjoint(t.id for t in theirs)
    assert all(t.deliveries == 1 and t.kind == "succeeded" for t in (*mine, *theirs))
    assert other.claim_transitions(token=uuid.uuid4(), limit=10, lease=60) == []


def test_settling_deletes_the_delivered_and_keeps_the_failed(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(3)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in claim(store, lease)])
    token = uuid.uuid4()
    done, retried, dead = store.claim_transitions(token=token, limit=10, lease=60)
    settled = store.settle_transitions(
        token=token,
        results=[
            DeliveryResult(id=done.id, delivered=("a.b",)),
            DeliveryResult(id=retried.id, delivered=("a.a",), failed_observer="a.b", error="Traceback: boom\x00", retry_delay=0),
            DeliveryResult(id=dead.id, failed_observer="a.a", error="boom", dead=True),
        ],
    )
    assert settled == {done.id, retried.id, dead.id}
    left = {t.id: t for t in rows.transitions()}
    assert set(left) == {retried.id, dead.id}
    assert (left[retried.id].state, list(left[retried.id].delivered_to), left[retried.id].failed_observer) == (
        "pending",
        ["a.a"],
        "a.b",
    )
    assert left[retried.id].last_error == "Traceback: boom\\x00"  # a NUL shown escaped, as text can hold it
    assert left[dead.id].state == "dead"
    # The retry is due again at once (no delay); the dead one never is.
    (again,) = store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60)
    assert (again.id, again.deliveries, again.delivered_to) == (retried.id, 2, ("a.a",))


def test_a_lapsed_claim_is_claimed_again_and_its_late_settle_changes_nothing(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(1)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in claim(store, lease)])
    first = uuid.uuid4()
    (claimed,) = store.claim_transitions(token=first, limit=10, lease=60)
    assert store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60) == []  # held for its lease
    rows.lapse_transition_claims()  # the first claimer died
    second = uuid.uuid4()
    (again,) = store.claim_transitions(token=second, limit=10, lease=60)
    assert (again.id, again.deliveries) == (claimed.id, 2)
    assert store.settle_transitions(token=first, results=[DeliveryResult(id=claimed.id)]) == set()
    assert [t.id for t in rows.transitions()] == [claimed.id]
    assert store.settle_transitions(token=second, results=[DeliveryResult(id=claimed.id)]) == {claimed.id}
    assert rows.transitions() == []


def test_claiming_or_settling_nothing_costs_no_round_trip(store):
    before = store.round_trips
    assert store.claim_transitions(token=uuid.uuid4(), limit=0, lease=60) == []
    assert store.settle_transitions(token=uuid.uuid4(), results=[]) == set()
    assert store.round_trips == before


@pytest.mark.stores("postgres")
def test_a_batch_with_observers_is_still_one_round_trip(store, lease, rows):
    store.observed = WATCH_ALL
    rows.make_jobs(5)
    jobs = claim(store, lease)
    before = store.round_trips
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in jobs])
    assert store.round_trips == before + 1
    assert len(rows.transitions()) == 5


# ---- whose a delivery is: the observers a transition was noted for ------------------------------

FIRST, SECOND, ELSEWHERE = "app.watch.first", "app.watch.second", "app.watch.elsewhere"
WATCH_BY_NAME = json.dumps(
    [
        {"kind": "succeeded", "task_path": None, "queue": None, "observer": FIRST},
        {"kind": "succeeded", "task_path": None, "queue": None, "observer": SECOND},
        {"kind": "failed", "task_path": None, "queue": None, "observer": SECOND},
        {"kind": "failed", "task_path": None, "queue": "elsewhere", "observer": ELSEWHERE},
    ]
)


def test_a_transition_is_noted_for_the_observers_that_watch_it(store, lease, rows):
    store.observed = WATCH_BY_NAME
    rows.make_jobs(2)
    ok, failed = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(ok), outcome(failed, OutcomeKind.FAILED)])
    assert {t.job_id: sorted(t.observers) for t in rows.transitions()} == {ok.id: [FIRST, SECOND], failed.id: [SECOND]}


def test_a_claim_takes_only_the_deliveries_of_the_observers_it_has_registered(store, lease, rows):
    """A rolling deploy: a worker that lacks an observer leaves its deliveries alone; one that
    has only some of a transition's observers delivers those and leaves the row to the rest."""
    store.observed = WATCH_BY_NAME
    rows.make_jobs(1)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job) for job in claim(store, lease)])
    assert store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60, observers=[ELSEWHERE]) == []
    assert store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60) == []  # it registered none

    token = uuid.uuid4()
    (record,) = store.claim_transitions(token=token, limit=10, lease=60, observers=[FIRST, ELSEWHERE])
    assert sorted(record.observers) == [FIRST, SECOND] and record.delivered_to == ()
    assert store.settle_transitions(token=token, results=[DeliveryResult(id=record.id, delivered=(FIRST,))]) == {record.id}
    (row,) = rows.transitions()
    assert (row.state, list(row.delivered_to), row.claim_token) == ("pending", [FIRST], None)  # left for SECOND
    assert store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60, observers=[FIRST]) == []  # its part is done

    token = uuid.uuid4()
    (again,) = store.claim_transitions(token=token, limit=10, lease=60, observers=[SECOND, FIRST])
    assert (again.id, again.delivered_to, again.deliveries) == (record.id, (FIRST,), 2)
    assert store.settle_transitions(token=token, results=[DeliveryResult(id=again.id, delivered=(SECOND,))]) == {again.id}
    assert rows.transitions() == []


def test_a_claim_records_its_deliverer_and_the_observers_it_has_registered(store, rows):
    """The Transitions page tells a delivery no live worker can make from one that waits its turn."""
    store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60, observers=[SECOND, FIRST], deliverer="host:1:default")
    store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60, observers=[ELSEWHERE], deliverer="host:2:default")
    assert rows.deliverers() == {"host:1:default": [FIRST, SECOND], "host:2:default": [ELSEWHERE]}
    store.claim_transitions(token=uuid.uuid4(), limit=10, lease=60, observers=[FIRST], deliverer="host:1:default")  # redeployed
    assert rows.deliverers()["host:1:default"] == [FIRST]


# ---- dependents a failure cancels (settle_dependents) --------------------------------------------

WATCH_CANCELS = json.dumps(
    [{"kind": "failed", "task_path": None, "queue": None}, {"kind": "cancelled", "task_path": None, "queue": None}]
)


def new(after=(), **fields) -> NewJob:
    fields.setdefault("task_path", "app.tasks.t")
    return NewJob(payload={"args": [], "kwargs": {}}, max_attempts=1, after=tuple(after), **fields)


def a_workflow(store):
    """A root, a chain of two behind it (cancelled when it fails), one that runs anyway and one
    held for an operator: their ids in that order."""
    return store.enqueue_many(
        [
            new(),
            new(after=[After(position=0)]),
            new(after=[After(position=1)]),
            new(after=[After(position=0, on_failure="run")]),
            new(after=[After(position=0, on_failure="hold")]),
        ]
    )


def test_each_dependent_a_failure_cancels_is_noted_once_as_never_run(store, lease, rows):
    store.observed = WATCH_CANCELS
    root, child, grandchild, runs_anyway, held = a_workflow(store)
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.FAILED)])
    assert rows.states([child, grandchild, runs_anyway, held]) == {
        child: "cancelled",
        grandchild: "cancelled",
        runs_anyway: "ready",
        held: "held",
    }
    # The dependents never ran: their attempt is the job's attempts so far, none.
    assert noted(rows) == sorted([(root, 1, "failed"), (child, 0, "cancelled"), (grandchild, 0, "cancelled")])
    assert {(t.task_path, t.queue, t.state, t.deliveries, tuple(t.delivered_to)) for t in rows.transitions()} == {
        ("app.tasks.t", "default", "pending", 0, ())
    }


def test_a_cancelled_dependent_is_noted_only_when_watched(store, lease, rows):
    store.observed = json.dumps([{"kind": "failed", "task_path": None, "queue": None}])
    root, *_ = a_workflow(store)
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.FAILED)])
    assert noted(rows) == [(root, 1, "failed")]


def test_nothing_is_noted_for_cancelled_dependents_while_nothing_is_observed(store, lease, rows):
    child = a_workflow(store)[1]
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.QUARANTINED)])
    assert rows.job(child).state == "cancelled"
    assert rows.transitions() == []


def test_a_cancelled_dependent_is_noted_by_its_own_task_and_queue(store, lease, rows):
    store.observed = json.dumps(
        [
            {"kind": "cancelled", "task_path": "app.tasks.watched", "queue": None},
            {"kind": "cancelled", "task_path": None, "queue": "emails"},
        ]
    )
    root, by_task, by_queue, neither = store.enqueue_many(
        [
            new(),
            new(after=[After(position=0)], task_path="app.tasks.watched"),
            new(after=[After(position=0)], queue="emails"),
            new(after=[After(position=0)], queue="reports"),
        ]
    )
    (job,) = claim(store, lease)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.CANCELLED)])
    assert rows.states([by_task, by_queue, neither]) == dict.fromkeys([by_task, by_queue, neither], "cancelled")
    assert noted(rows) == sorted([(by_task, 0, "cancelled"), (by_queue, 0, "cancelled")])


def test_an_outcome_the_fence_refuses_notes_no_dependent(store, lease, rows):
    store.observed = WATCH_CANCELS
    child = a_workflow(store)[1]
    (job,) = claim(store, lease)
    rows.lapse(lease.id)
    assert store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(job, OutcomeKind.FAILED)]) == set()
    assert rows.job(child).state == "waiting"
    assert rows.transitions() == []


def test_a_suspect_failed_by_expiry_notes_the_dependents_it_cancels(store, lease, rows):
    store.observed = json.dumps([{"kind": "cancelled", "task_path": None, "queue": None}])
    (root,) = rows.make_jobs(1, suspect=True, max_attempts=1)
    child, grandchild = store.enqueue_many([new(after=[After(job_id=root.pk)]), new(after=[After(position=0)])])
    claim(store, lease)
    rows.lapse(lease.id)
    assert store.expire_leases(limit=10) == 1
    assert rows.job(root.pk).state == "failed"  # the suspect paid, with no attempt left
    assert noted(rows) == sorted([(child, 0, "cancelled"), (grandchild, 0, "cancelled")])

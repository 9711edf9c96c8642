"""Observers and atomic tasks under the deterministic test pump: delivered inline by drain(), in
the attempt scope, retried after their backoff on virtual time, dead after their tries."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.tasks.exceptions import InvalidTask

from backwave.models import Job, Transition
from backwave.shell.execution import Commit
from backwave.testing import DeterministicPump

from . import observing


@pytest.fixture(autouse=True)
def clean_slate():
    observing.SEEN.clear()
    observing.FLAKY_FAILURES["left"] = 0


@pytest.fixture
def pump(db, settings):
    settings.BACKWAVE = {
        **settings.BACKWAVE,
        "OBSERVER_MAX_DELIVERIES": 3,
        "OBSERVER_BACKOFF_BASE": 10.0,
        "OBSERVER_BACKOFF_MAX": 10.0,
    }
    with DeterministicPump(tasks=[observing], observers=[observing], queues=["e2e"]) as pump:
        yield pump


def test_drain_delivers_each_applied_transition_once_to_the_observers_watching_it(pump):
    failing = int(observing.fails_once.enqueue().id)
    observing.quiet.enqueue()
    first = pump.drain()
    assert (first.retried, first.delivered) == (1, 1)
    assert observing.SEEN == [("watch", failing, 1, "retried", 1)]
    pump.advance(1.0)
    second = pump.drain()
    assert (second.succeeded, second.delivered) == (1, 1)
    assert observing.SEEN[1:] == [("flaky_observer", failing, 2, "succeeded", 1), ("watch", failing, 2, "succeeded", 1)]
    assert not Transition.objects.exists()  # delivered rows are gone; nobody watches quiet()


def test_a_failing_observer_is_retried_after_its_backoff_and_the_others_are_not_run_again(pump):
    observing.FLAKY_FAILURES["left"] = 1
    succeeded = int(observing.fails_once.enqueue().id)
    pump.drain()
    pump.advance(1.0)
    drained = pump.drain()
    assert (drained.delivered, drained.undelivered) == (0, 1)  # the flaky one raised, "watch" (after it) waits
    (row,) = Transition.objects.all()
    assert (row.state, row.deliveries, row.failed_observer) == ("pending", 1, "tests.testing.observing.flaky_observer")
    assert "ConnectionError: the pager is down" in row.last_error
    assert pump.drain().delivered == 0  # not due yet: its backoff is virtual time
    pump.advance(10.0)
    assert pump.drain().delivered == 1
    assert [entry for entry in observing.SEEN if entry[2] == 2] == [
        ("flaky_observer", succeeded, 2, "succeeded", 2),
        ("watch", succeeded, 2, "succeeded", 2),
    ]


def test_an_observer_that_keeps_failing_leaves_the_transition_dead(pump):
    observing.FLAKY_FAILURES["left"] = 99
    observing.fails_once.enqueue()
    pump.drain()
    pump.advance(1.0)
    pump.drain()
    for _ in range(3):
        pump.advance(10.0)
        pump.drain()
    (row,) = Transition.objects.all()
    assert (row.state, row.deliveries) == ("dead", 3)
    pump.advance(3600.0)
    assert pump.drain().undelivered == 0  # a dead transition waits for an operator


def test_an_atomic_task_commits_its_writes_with_its_outcome(pump):
    result = observing.make_user_atomically.enqueue("ada")
    drained = pump.drain()
    assert drained.succeeded == 2  # it, and the job its observer enqueued (below)
    assert [a.result for a in drained.attempts] == ["committed", "succeeded"]
    assert Job.objects.get(id=result.id).state == "succeeded"
    assert User.objects.filter(username="ada").exists()
    # Its transition is noted by the statement the attempt itself sent, and its observer's
    # follow-up job runs in the same drain.
    assert ("watch", int(result.id), 1, "succeeded", 1) in observing.SEEN
    assert Job.objects.filter(task_path=observing.quiet.module_path, state="succeeded").count() == 1


def test_an_atomic_task_that_raises_rolls_its_writes_back(pump):
    observing.make_user_atomically.using(max_attempts=1).enqueue("bob", fail=True)
    drained = pump.drain()
    assert drained.failed == 1
    assert not User.objects.filter(username="bob").exists()
    assert [entry[3] for entry in observing.SEEN] == ["failed"]


def test_an_atomic_task_whose_fence_refuses_rolls_its_writes_back(pump, monkeypatch):
    """The attempt's in-transaction write goes out under a lease that does not hold the job (as a
    zombie's would): the fence refuses it, the user the handler created rolls back with it, and
    the attempt reports a plain success, for the batch write to be fenced in its turn. (Here the
    pump's own lease still holds the job, so that batch write lands: a success with no effect,
    which is how the rollback shows.)"""
    stranger = uuid.uuid4()
    monkeypatch.setattr(
        pump,
        "_commit",
        lambda job: Commit(
            alias="default",
            write=lambda _connection, record: pump.store.write_outcomes_many(lease_id=stranger, outcomes=[record]),
        ),
    )
    observing.make_user_atomically.enqueue("eve")
    drained = pump.drain()
    assert drained.attempts[0].result == "succeeded"  # not "committed": the attempt wrote nothing
    assert not User.objects.filter(username="eve").exists()


def test_atomic_is_refused_for_async_tasks_non_booleans_and_using():
    with pytest.raises(InvalidTask, match="async def and cannot be atomic"):
        type(observing.quiet)(func=observing.async_handler, atomic=True, queue_name="e2e", backend="default")
    with pytest.raises(InvalidTask, match="atomic of task .* must be True or False"):
        type(observing.quiet)(func=observing.quiet.func, atomic="yes", queue_name="e2e", backend="default")
    # The worker runs the task registered under the job's name: atomic is the definition's.
    with pytest.raises(InvalidTask, match=r"cannot be set with \.using\(\).*@task\(atomic=True\)"):
        observing.quiet.using(atomic=True)

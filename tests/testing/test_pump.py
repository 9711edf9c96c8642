"""The deterministic test pump inside ordinary pytest-django tests: no worker, no sleeps."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from backwave.core.driver import State
from backwave.models import Attempt, Job, Queue, Schedule
from backwave.testing import DeterministicPump, PumpStuck

from . import tasks


@pytest.fixture
def pump(db):
    with DeterministicPump(tasks=[tasks]) as pump:
        yield pump


def state_of(result) -> str:
    return Job.objects.get(pk=result.id).state


def test_drain_runs_what_was_enqueued_in_the_tests_transaction(pump):
    result = tasks.add.enqueue(2, 3)
    assert connection.in_atomic_block  # the db fixture's transaction, never committed

    drained = pump.drain()

    assert (drained.succeeded, drained.retried, drained.failed, drained.quarantined) == (1, 0, 0, 0)
    result.refresh()
    assert (result.status.name, result.return_value) == ("SUCCESSFUL", 5)
    assert pump.drain().attempts == ()  # nothing left


@pytest.mark.django_db(transaction=True)
def test_it_works_in_a_transactional_test_too():
    with DeterministicPump(tasks=[tasks]) as pump:
        results = [tasks.add.enqueue(n, n) for n in range(3)]
        assert not connection.in_atomic_block  # autocommit: every row is committed
        assert pump.drain().succeeded == 3
    for result in results:
        result.refresh()
    assert [result.return_value for result in results] == [0, 2, 4]


def test_a_retry_comes_due_only_when_the_clock_advances(pump):
    result = tasks.flaky.enqueue(succeed_on=3)

    assert pump.drain().retried == 1
    assert state_of(result) == "ready"
    assert pump.drain().attempts == ()  # the backoff (1 to 2 seconds) has not passed
    pump.advance(0.9)
    assert pump.drain().attempts == ()  # still not: the delay is at least half the nominal 2 s
    pump.advance(1.1)
    assert pump.drain().retried == 1
    pump.advance(2)
    drained = pump.drain()

    assert drained.succeeded == 1
    result.refresh()
    assert result.return_value["attempt"] == 3
    assert list(Attempt.objects.filter(job_id=result.id).values_list("number", "state")) == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),
    ]


def test_a_job_that_runs_out_of_attempts_is_dead(pump):
    result = tasks.always_fails.enqueue()
    assert pump.drain().retried == 1
    pump.advance(1)
    drained = pump.drain()
    assert (drained.failed, state_of(result)) == (1, "failed")
    assert [error[1] for error in drained.errors] == ["builtins.ValueError"]


def test_jobs_a_task_enqueues_run_in_the_same_drain(pump):
    tasks.fan_out.enqueue(3)
    drained = pump.drain()
    assert drained.succeeded == 4
    assert sorted(Job.objects.filter(task_path=tasks.add.module_path).values_list("return_value", flat=True)) == [0, 2, 4]


def test_jobs_run_in_queue_order_then_priority_as_a_strict_policy_claims(pump):
    assert pump.options.policy.queues[:2] == ("default", "emails")  # the order of TASKS' QUEUES
    tasks.send_email.using(priority=10).enqueue("a@example.com")
    tasks.add.enqueue(1, 1)
    tasks.add.using(priority=5).enqueue(2, 2)
    order = [(Job.objects.get(pk=a.job_id).task_path.rsplit(".", 1)[1], a.return_value) for a in pump.drain().attempts]
    assert order == [("add", 4), ("add", 2), ("send_email", "sent to a@example.com")]


def test_a_job_scheduled_for_later_runs_when_its_time_comes(pump):
    result = tasks.add.using(run_after=timezone.now() + timedelta(minutes=5)).enqueue(1, 2)
    assert pump.drain().attempts == ()
    pump.advance(299)
    assert pump.drain().attempts == ()
    pump.advance(1)
    assert pump.drain().succeeded == 1
    assert state_of(result) == "succeeded"


def test_a_long_advance_keeps_the_pump_working(pump):
    pump.drain()
    pump.advance(3 * 86_400)  # far past the pump's lease: it opens a new one
    result = tasks.add.enqueue(20, 22)
    assert pump.drain().succeeded == 1
    result.refresh()
    assert result.return_value == 42
    assert pump.driver.state is State.RUNNING


def test_a_crashed_workers_job_runs_again_once_its_lease_lapses(pump):
    result = tasks.add.enqueue(1, 1)
    # Another worker claims the job and dies with it: its lease (30 s) is never renewed.
    dead = uuid.uuid4()
    pump.store.open_lease(lease_id=dead, worker_id="dead:1", group="g", hostname="h", pid=1, duration=30)
    (claimed,) = pump.store.claim_jobs(lease_id=dead, worker_id="dead:1", queues=["default"], limit=1)
    assert claimed.id == int(result.id)

    assert pump.drain().attempts == ()
    pump.advance(31)
    drained = pump.drain()

    assert drained.succeeded == 1
    assert list(Attempt.objects.filter(job_id=claimed.id).values_list("number", "state", "worker_id")) == [
        (1, "lapsed", "dead:1"),
        (2, "succeeded", pump.worker_id),
    ]


def test_an_unknown_task_is_quarantined(db):
    with DeterministicPump(tasks=[tasks.add]) as pump:  # send_email is not one of its tasks
        result = tasks.send_email.enqueue("a@example.com")
        drained = pump.drain()
    assert (drained.quarantined, state_of(result)) == (1, "quarantined")


def test_a_handler_that_breaks_the_transaction_is_rolled_back_alone(pump):
    User.objects.create(username="before")
    tasks.make_user_twice.enqueue("twice")
    tasks.make_user.enqueue("after")

    assert pump.drain().succeeded == 2

    # The broken attempt's own writes went with its savepoint; everything else stands.
    assert sorted(User.objects.values_list("username", flat=True)) == ["after", "before"]


def test_a_handler_that_leaves_a_transaction_open_is_rolled_back(pump):
    tasks.leaves_atomic_open.enqueue("ghost")
    tasks.make_user.enqueue("real")
    assert pump.drain().succeeded == 2
    assert list(User.objects.values_list("username", flat=True)) == ["real"]
    assert connection.in_atomic_block and len(connection.atomic_blocks) == 1  # only the test's own


def test_an_async_task_runs_inline_too(pump):
    result = tasks.async_add.enqueue(4, 5)
    assert pump.drain().succeeded == 1
    result.refresh()
    assert result.return_value == 9


def test_a_task_that_enqueues_itself_for_ever_stops_at_the_limit(pump):
    tasks.enqueues_itself.enqueue()
    with pytest.raises(PumpStuck, match="more than 50 attempts"):
        pump.drain(limit=50)


def test_the_pump_cannot_be_called_from_a_task_it_runs(pump, monkeypatch):
    monkeypatch.setattr(tasks, "CALLBACK", pump.drain)
    tasks.calls_back.enqueue()
    (error,) = pump.drain().errors
    assert error[1] == "builtins.RuntimeError" and "called from inside a task" in error[2]


def test_two_runs_make_the_same_decisions(db):
    def run() -> list:
        with DeterministicPump(tasks=[tasks]) as pump:
            first = tasks.flaky.enqueue(succeed_on=2)
            tasks.always_fails.enqueue()
            seen = [(a.job_id - int(first.id), a.attempt, a.result) for a in pump.drain().attempts]
            pump.advance(2)
            seen += [(a.job_id - int(first.id), a.attempt, a.result) for a in pump.drain().attempts]
            run_at = list(Job.objects.order_by("pk").values_list("state", "attempts"))
        Job.objects.all().delete()
        return seen + run_at

    assert run() == run()


def test_drain_after_close_says_so(pump):
    pump.drain()
    pump.close()
    with pytest.raises(PumpStuck, match="closed"):
        pump.drain()


def test_the_plugins_fixture_runs_the_tasks_the_worker_would_find(backwave_pump):
    from project.demo import tasks as demo_tasks

    result = demo_tasks.fast_job.enqueue(21)
    assert backwave_pump.drain().succeeded == 1
    result.refresh()
    assert result.return_value == 42


def test_schedule_slots_come_due_as_the_clock_advances(pump, settings):
    settings.BACKWAVE = {
        **settings.BACKWAVE,
        "SCHEDULES": {"sum": {"task": tasks.add.module_path, "cron": "* * * * *", "args": [1, 2]}},
    }
    assert pump.drain().attempts == ()  # synced; the first maintenance run finds the next slot
    pump.advance(60)
    assert pump.drain().succeeded == 1
    pump.advance(3600)  # an hour of slots: after a gap only the latest one is minted
    assert pump.drain().succeeded == 1
    minted = Job.objects.filter(schedule__name="sum").order_by("pk")
    assert [job.return_value for job in minted] == [3, 3]
    assert minted[1].schedule_slot - minted[0].schedule_slot >= timedelta(minutes=60)


def test_a_paused_queue_waits_and_drain_still_returns(pump, settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "QUEUES": {"emails": {"paused": True}}}
    result = tasks.send_email.enqueue("a@example.com")
    tasks.add.enqueue(1, 1)
    assert pump.drain().succeeded == 1  # add ran; the paused queue's job waits, and drain() returns
    assert state_of(result) == "ready"
    Queue.objects.filter(name="emails").update(paused=False)
    assert pump.drain().succeeded == 1


def test_retention_purges_finished_jobs_on_virtual_time(pump, settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "RETENTION": {"succeeded": 3600}}
    pump = DeterministicPump(tasks=[tasks])  # retention is read when the pump is made, as by a worker
    result = tasks.add.enqueue(1, 1)
    pump.drain()
    pump.advance(3599)
    pump.drain()
    assert Job.objects.filter(pk=result.id).exists()
    pump.advance(60)
    pump.drain()
    assert not Job.objects.filter(pk=result.id).exists()
    pump.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_duration": float("nan")}, r"^Worker Group 'backwave-test': lease_duration must be a number of seconds above 0"),
        ({"poll_interval": -1}, r"^Worker Group 'backwave-test': poll_interval must be a number of seconds above 0"),
        (
            {"heartbeat_interval": 3500},
            r"^Worker Group 'backwave-test': heartbeat_interval \(3500 s\) must be below 90% of lease_duration",
        ),
    ],
)
def test_options_a_worker_would_refuse_are_refused_here_too(db, overrides, message):
    from backwave.core.options import WorkerGroupConfigError

    with pytest.raises(WorkerGroupConfigError, match=message):
        DeterministicPump(tasks=[tasks], **overrides)


@pytest.mark.django_db(databases=["default", "other"])
def test_a_pump_on_another_database_runs_that_backends_jobs_with_that_databases_settings(settings):
    settings.BACKWAVE = {
        **settings.BACKWAVE,
        "QUEUES": {"remote": {"concurrency_limit": 2}, "emails": {"paused": True}},
        "SCHEDULES": {
            "remote-sum": {"task": tasks.remote_add.module_path, "cron": "* * * * *", "args": [2, 3]},
            "local-sum": {"task": tasks.add.module_path, "cron": "* * * * *", "args": [1, 2]},
        },
    }
    result = tasks.remote_add.enqueue(20, 1)
    assert Job.objects.using("other").filter(pk=result.id).exists()
    with DeterministicPump(tasks=[tasks], database="other") as pump:
        assert pump.options.policy.queues == ("remote",)  # the queues of the backends on "other"
        assert pump.drain().succeeded == 1
        result.refresh()
        assert result.return_value == 21
        pump.advance(60)
        assert pump.drain().succeeded == 1  # the remote schedule's slot, minted on "other"
    # Each database got the schedules and queue settings of its own backends' queues, and only those.
    assert list(Schedule.objects.using("other").values_list("name", flat=True)) == ["remote-sum"]
    assert dict(Queue.objects.using("other").values_list("name", "concurrency_limit")) == {"remote": 2}
    assert not Schedule.objects.exists() and not Queue.objects.exists()
    assert [job.return_value for job in Job.objects.using("other").filter(schedule__name="remote-sum")] == [5]


def test_task_finished_is_sent_per_applied_attempt_after_its_write_as_in_a_worker(pump):
    from django.tasks.signals import task_finished

    seen = []

    def record(sender, task_result, **kwargs):
        written = Attempt.objects.filter(job_id=int(task_result.id)).count()
        seen.append((task_result.attempts, task_result.status.name, written))

    task_finished.connect(record, weak=False)
    try:
        tasks.flaky.enqueue(succeed_on=2)
        assert pump.drain().retried == 1
        pump.advance(2)
        assert pump.drain().succeeded == 1
    finally:
        task_finished.disconnect(record)

    # Once per applied outcome, each once its attempt row was written.
    assert seen == [(1, "FAILED", 1), (2, "SUCCESSFUL", 2)]


def test_a_value_jsonb_cannot_store_fails_its_attempt_not_the_batch(pump):
    nan = tasks.returns_nan.enqueue()
    fine = tasks.add.enqueue(1, 2)

    drained = pump.drain()

    assert (drained.succeeded, drained.failed) == (1, 1)
    assert state_of(fine) == "succeeded"
    attempt = Attempt.objects.get(job_id=nan.id)
    assert attempt.error_class == "backwave.UnstorableResult"
    assert "the return value holds NaN at ['score']" in attempt.traceback


def test_a_return_value_of_a_type_json_lacks_fails_with_a_type_error_as_in_django(pump):
    # Django's backends record builtins.TypeError ("Unsupported type: ...") for a return value
    # JSON has no type for; BackWave records the same class, with where the value is.
    result = tasks.returns_a_set.enqueue()

    assert pump.drain().failed == 1

    attempt = Attempt.objects.get(job_id=result.id)
    assert attempt.error_class == "builtins.TypeError"
    assert attempt.traceback.endswith(
        "TypeError: Unsupported type: <class 'set'>: the return value holds a set at ['ids'], which is not JSON-serialisable\n"
    )
    result.refresh()
    assert result.errors[0].exception_class is TypeError


def test_max_result_bytes_bounds_a_return_value(pump, settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "MAX_RESULT_BYTES": 10}
    short, long = tasks.add.enqueue(1, 2), tasks.send_email.enqueue("someone@example.com")

    drained = pump.drain()

    # The task's retry rules apply to an unstorable result as to any failure: it runs again.
    assert (drained.succeeded, drained.retried, state_of(short), state_of(long)) == (1, 1, "succeeded", "ready")
    attempt = Attempt.objects.get(job_id=long.id)
    assert attempt.error_class == "backwave.UnstorableResult"
    assert "the return value is 29 bytes of JSON, over BACKWAVE['MAX_RESULT_BYTES'] (10 bytes)" in attempt.traceback

"""Attempt control in the deterministic test pump: advance past a time limit, snooze, discard,
retry rules, a task's backoff, a cancel during the run, progress."""

from __future__ import annotations

import pytest

from backwave.models import Attempt, Job
from backwave.testing import DeterministicPump

from . import tasks


@pytest.fixture
def pump(db):
    with DeterministicPump(tasks=[tasks]) as pump:
        tasks.PUMP["pump"] = pump
        yield pump
    tasks.PUMP.clear()


def _attempts(result):
    return [(a.state, a.error_class) for a in Attempt.objects.filter(job_id=result.id).order_by("number")]


def test_an_attempt_past_its_time_limit_is_failed_and_retried(pump):
    result = tasks.slow_first_time.enqueue()
    drained = pump.drain()
    assert (drained.retried, drained.succeeded) == (1, 0)
    assert tasks.PUMP["saw_stop"] is True  # the context said so once the limit had passed
    pump.advance(2)
    assert pump.drain().succeeded == 1
    assert _attempts(result) == [("failed", "backwave.TimeLimitExceeded"), ("succeeded", "")]
    assert Job.objects.get(pk=result.id).return_value == 2


def test_a_snooze_is_not_a_failed_attempt(pump):
    result = tasks.snoozes.enqueue(30)
    assert pump.drain().snoozed == 1
    pump.advance(29)
    assert pump.drain().attempts == ()
    pump.advance(1)
    assert pump.drain().succeeded == 1  # max_attempts=1, yet it ran twice: the snooze did not count
    assert _attempts(result) == [("snoozed", "backwave.Snooze"), ("succeeded", "")]
    final = tasks.snoozes.get_result(result.id)
    assert (final.return_value, final.progress, final.errors) == (2, {"done": True}, [])


def test_a_cancel_during_the_run_ends_the_attempt_cancelled(pump):
    result = tasks.cancels_itself.enqueue()
    assert pump.drain().cancelled == 1
    assert _attempts(result) == [("cancelled", "backwave.Cancelled")]
    assert "cancelled by test" in Attempt.objects.get(job_id=result.id).traceback


@pytest.mark.parametrize(
    ("kind", "states"),
    [
        ("gone", [("failed", "tests.testing.tasks.Gone")]),  # discard_on wins over retry_on
        ("other", [("failed", "builtins.KeyError")]),  # not in retry_on: no retry
        ("busy", [("failed", "tests.testing.tasks.Busy")] * 3),  # backoff 7 s twice, then None: no more
    ],
)
def test_retry_rules_and_the_tasks_backoff(pump, kind, states):
    result = tasks.ruled.enqueue(kind)
    pump.drain()
    for _ in range(4):
        pump.advance(7)
        pump.drain()
    assert _attempts(result) == states
    assert Job.objects.get(pk=result.id).state == "failed"


def test_the_tasks_backoff_sets_the_delay(pump):
    result = tasks.ruled.enqueue("busy")
    pump.drain()
    pump.advance(6.9)
    assert pump.drain().attempts == ()
    pump.advance(0.1)
    assert len(pump.drain().attempts) == 1
    assert len(_attempts(result)) == 2


def test_task_finished_says_what_was_stored_for_a_cancelled_attempt(pump):
    from django.tasks.signals import task_finished

    seen = []

    def record(sender, task_result, **kwargs):
        seen.append((task_result.status, [e.exception_class_path for e in task_result.errors]))

    task_finished.connect(record, weak=False)
    try:
        tasks.cancels_itself.enqueue()
        pump.drain()
    finally:
        task_finished.disconnect(record)
    assert seen == [("FAILED", ["backwave.Cancelled"])]  # its handler returned, but it was cancelled


def test_a_broken_backoff_falls_back_to_the_default_one(pump, caplog):
    result = tasks.broken_backoff.enqueue()
    assert pump.drain().retried == 1  # reported and retried, not lost with its thread
    assert "backoff() of task" in caplog.text
    pump.advance(1)
    assert pump.drain().failed == 1
    assert len(_attempts(result)) == 2


def _due_in(result) -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM run_at - now()) FROM backwave_job WHERE id = %s", [result.id])
        return float(cursor.fetchone()[0])


def test_a_huge_delay_from_the_tasks_backoff_stays_a_retry_at_the_maximum(pump):
    """1e15 s is past any timestamp PostgreSQL holds: written as asked, the job failed for good."""
    from backwave.core.backoff import MAX_DELAY

    result = tasks.backs_off_for_ages.enqueue()
    assert pump.drain().retried == 1
    job = Job.objects.get(pk=result.id)
    assert (job.state, job.attempts) == ("ready", 1)
    # The run time is cut to the maximum, not refused (now() is the test transaction's start).
    assert MAX_DELAY - 60 <= _due_in(result) <= MAX_DELAY + 60
    pump.advance(MAX_DELAY)
    assert pump.drain().retried == 1
    assert _attempts(result) == [("failed", "builtins.ValueError")] * 2


def test_a_snooze_of_the_maximum_delay_is_kept(pump):
    from backwave.core.backoff import MAX_DELAY

    result = tasks.snoozes_for_ages.enqueue()
    assert pump.drain().snoozed == 1
    assert Job.objects.get(pk=result.id).state == "ready"
    pump.advance(MAX_DELAY)
    assert pump.drain().succeeded == 1

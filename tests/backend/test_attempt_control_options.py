"""Attempt control options of a task (timeout, retry_on, discard_on, backoff) and the context's
checks (set_progress, metadata, Snooze): each refused where the mistake is made."""

from datetime import timedelta

import pytest
from django.tasks.exceptions import InvalidTask

import backwave
from backwave.models import Job
from backwave.tasking.context import MAX_PROGRESS_BYTES, AttemptControl

from . import sample_tasks


@pytest.mark.django_db
def test_a_time_limit_per_task_or_per_enqueue_is_stored_on_the_job():
    result = sample_tasks.add.using(timeout=2.5).enqueue(1, 2)
    assert Job.objects.get(pk=result.id).timeout == 2.5
    plain = sample_tasks.add.enqueue(1, 2)
    assert Job.objects.get(pk=plain.id).timeout is None


@pytest.mark.parametrize("value", [0, -1, float("inf"), "10", True, 8 * 86_400])
def test_a_bad_time_limit_is_refused(value):
    with pytest.raises(InvalidTask, match=rf"timeout of task 'tests.backend.sample_tasks.add' must be .* got {value!r}"):
        sample_tasks.add.using(timeout=value)


def test_retry_rules_must_be_exception_classes_and_the_backoff_a_callable():
    from dataclasses import replace

    with pytest.raises(
        InvalidTask, match="retry_on of task .* must be an exception class or a tuple of them, got \\(<class 'int'>,\\)"
    ):
        replace(sample_tasks.add, retry_on=(int,))
    with pytest.raises(InvalidTask, match="discard_on .* got 'ValueError'"):
        replace(sample_tasks.add, discard_on="ValueError")
    with pytest.raises(InvalidTask, match="backoff of task .* must be a callable"):
        replace(sample_tasks.add, backoff=5)
    one = replace(sample_tasks.add, retry_on=ValueError)
    assert one.retry_on == (ValueError,)  # a single class is a tuple of one


@pytest.mark.parametrize("bad", [float("nan"), "a\x00b", "\ud800", {1, 2}, "x" * (MAX_PROGRESS_BYTES + 1)])
def test_progress_that_cannot_be_stored_is_refused_where_it_is_set(bad):
    control = AttemptControl(job_id=1, attempt=1, timeout=None)
    with pytest.raises(ValueError, match="set_progress"):
        control.set_progress({"value": bad})
    assert control.take_report() is None  # nothing half-set
    control.set_progress({"done": 1})
    assert control.take_report().progress == {"done": 1}
    assert control.take_report() is None  # reported once


def test_the_stop_flag_and_the_deadline():
    now = [100.0]
    control = AttemptControl(job_id=1, attempt=1, timeout=5.0, clock=lambda: now[0])
    assert not control.should_stop() and control.time_left() == 5.0
    now[0] = 105.0
    assert control.should_stop() and not control.cancelled and control.time_left() == 0.0
    other = AttemptControl(job_id=2, attempt=1, timeout=None)
    other.stop("cancelled by api")
    other.stop("timeout")  # the first reason stays
    assert other.should_stop() and other.cancelled and other.stop_reason == "cancelled by api"


@pytest.mark.parametrize("seconds", [-1, float("nan"), "5", 400 * 86_400])
def test_a_bad_snooze_is_refused_where_it_is_raised(seconds):
    with pytest.raises(ValueError, match="backwave.Snooze"):
        backwave.Snooze(seconds)


def test_a_snooze_takes_a_timedelta():
    assert backwave.Snooze(timedelta(minutes=2)).seconds == 120.0


def test_a_stop_that_comes_before_the_handler_starts_is_not_lost():
    """The pump registers an attempt's control as it hands the job over, so a cancel heard
    between the claim and the handler's first line still reaches the handler."""
    from backwave.core.jobs import ClaimedJob
    from backwave.shell.execution import AttemptControls, run_attempt
    from backwave.tasking.registry import TaskRegistry
    from tests.shell import worker_tasks

    task = worker_tasks.runs_until_cancelled
    job = ClaimedJob(
        id=7,
        task_path=task.module_path,
        queue="e2e",
        priority=0,
        payload={"args": [], "kwargs": {}},
        attempt=1,
        max_attempts=1,
        backoff_base=1.0,
        backoff_max=1.0,
    )
    controls = AttemptControls()
    controls.register(job)
    assert controls.stop(7, 1, "cancelled by api")
    report = run_attempt(
        job,
        registry=TaskRegistry([task]),
        worker_id="w",
        max_traceback_chars=1000,
        controls=controls,
        enter=lambda: None,
        leave=lambda: None,
    )
    assert (report.result, report.return_value) == ("cancelled", {"stopped_at": 0, "cancelled": True})
    assert controls.get(job) is None  # forgotten once the handler returned

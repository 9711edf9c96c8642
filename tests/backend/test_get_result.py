"""get_result: a Job and its Attempt rows as a django.tasks TaskResult, in at most two queries."""

import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import backwave

from backwave.models import Attempt, Job
from backwave.tasking.results import LeaseLapsed, UnresolvedTask, task_result_for_attempt

from . import sample_tasks


@pytest.mark.django_db
def test_ready_job(backend, django_assert_max_num_queries):
    enqueued = sample_tasks.add.enqueue(1, b=2)
    with django_assert_max_num_queries(2):
        result = backend.get_result(enqueued.id)
    assert result.id == enqueued.id
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([1], {"b": 2})
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    # The imported task itself: the row holds what its None options stand for (the defaults).
    assert result.task is sample_tasks.add
    assert result.enqueued_at == Job.objects.get().enqueued_at
    with pytest.raises(ValueError, match="not finished"):
        result.return_value


@pytest.mark.django_db
def test_running_job_counts_the_attempt_in_progress(backend, make_job):
    now = timezone.now()
    job = make_job(
        state="running", attempts=2, worker_id="host:1:default:0", started_at=now - timedelta(minutes=1), last_attempted_at=now
    )
    Attempt.objects.create(
        job=job,
        number=1,
        state="failed",
        worker_id="host:9:default:0",
        error_class="builtins.ValueError",
        traceback="Traceback...\nValueError: bad",
    )
    result = backend.get_result(str(job.pk))
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == ["host:9:default:0", "host:1:default:0"]
    assert result.attempts == 2
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (job.started_at, now, None)


@pytest.mark.django_db
def test_succeeded_job_has_its_return_value(backend, make_job):
    job = make_job(state="succeeded", attempts=1, return_value={"total": 3}, finished_at=timezone.now())
    Attempt.objects.create(job=job, number=1, state="succeeded", worker_id="w1", return_value={"total": 3})
    result = backend.get_result(str(job.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"total": 3}
    assert (result.errors, result.worker_ids, result.attempts) == ([], ["w1"], 1)
    assert result.is_finished and result.finished_at == job.finished_at


@pytest.mark.django_db
def test_failed_job_lists_every_failed_attempt(backend, make_job, django_assert_max_num_queries):
    job = make_job(state="failed", attempts=3, max_attempts=3, finished_at=timezone.now())
    Attempt.objects.create(job=job, number=1, state="failed", worker_id="w1", error_class="builtins.KeyError", traceback="tb1")
    Attempt.objects.create(job=job, number=2, state="lapsed", worker_id="w2", error_class="", traceback="lease lapsed")
    Attempt.objects.create(
        job=job, number=3, state="failed", worker_id="w3", error_class="builtins.ZeroDivisionError", traceback="tb3"
    )
    with django_assert_max_num_queries(2):
        result = backend.get_result(str(job.pk))
    assert result.status == TaskResultStatus.FAILED
    assert result.worker_ids == ["w1", "w2", "w3"]
    assert [error.traceback for error in result.errors] == ["tb1", "lease lapsed", "tb3"]
    assert [error.exception_class for error in result.errors] == [KeyError, LeaseLapsed, ZeroDivisionError]
    with pytest.raises(ValueError, match="failed"):
        result.return_value


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["cancelled", "quarantined"])
def test_cancelled_and_quarantined_jobs_are_failed(backend, make_job, state):
    job = make_job(state=state, finished_at=timezone.now())
    if state == "quarantined":
        Attempt.objects.create(
            job=job,
            number=1,
            state="quarantined",
            worker_id="w1",
            error_class="backwave.shell.execution.Unroutable",
            traceback="no task",
        )
    result = backend.get_result(str(job.pk))
    assert result.status == TaskResultStatus.FAILED
    # Django has no cancelled status: a cancel shows as the error that names who cancelled.
    assert [error.exception_class_path for error in result.errors] == (
        ["backwave.shell.execution.Unroutable"] if state == "quarantined" else ["backwave.Cancelled"]
    )


@pytest.mark.django_db
def test_result_task_is_the_task_itself_when_the_row_matches_it(backend):
    enqueued = sample_tasks.charge.enqueue(1)
    assert backend.get_result(enqueued.id).task is sample_tasks.charge


@pytest.mark.django_db
def test_result_task_carries_the_rows_options(backend):
    when = timezone.now() + timedelta(hours=1)
    enqueued = sample_tasks.charge.using(queue_name="reports", priority=3, run_after=when, max_attempts=2).enqueue(1)
    task = backend.get_result(enqueued.id).task
    assert task.func is sample_tasks.charge.func
    assert (task.queue_name, task.priority, task.max_attempts, task.tags) == ("reports", 3, 2, ("billing", "nightly"))


@pytest.mark.django_db
@pytest.mark.parametrize("result_id", ["999999999", "abc", "", "1.5", "-1", "0", "+1", " 1", "1_0", "\u00b2", str(2**70), None])
def test_unknown_or_malformed_ids_do_not_exist(backend, result_id, django_assert_max_num_queries):
    with django_assert_max_num_queries(1), pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result_id)


@pytest.mark.django_db
def test_jobs_of_another_backend_alias_do_not_exist_here(backend, make_job):
    job = make_job(backend="other")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(job.pk))


@pytest.mark.django_db
def test_refresh_follows_the_row():
    result = sample_tasks.add.enqueue(1, 2)
    Job.objects.filter(pk=int(result.id)).update(
        state="running",
        lease_id=uuid.uuid4(),
        worker_id="w1",
        attempts=1,
        started_at=timezone.now(),
        last_attempted_at=timezone.now(),
    )
    result.refresh()
    assert (result.status, result.worker_ids) == (TaskResultStatus.RUNNING, ["w1"])
    Job.objects.filter(pk=int(result.id)).update(state="succeeded", lease_id=None, return_value=3, finished_at=timezone.now())
    Attempt.objects.create(job_id=int(result.id), number=1, state="succeeded", worker_id="w1", return_value=3)
    async_to_sync(result.arefresh)()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 3, 1)


@pytest.mark.django_db
def test_task_get_result_and_mismatch():
    result = sample_tasks.add.enqueue(1, 2)
    assert sample_tasks.add.get_result(result.id).id == result.id
    assert async_to_sync(sample_tasks.add.aget_result)(result.id).id == result.id
    with pytest.raises(TaskResultMismatch):
        sample_tasks.send_email.get_result(result.id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task_path", "problem"),
    [
        ("tests.backend.sample_tasks.renamed_away", "importing it failed"),
        ("tests.backend.no_such_module.task", "importing it failed"),
        ("tests.backend.sample_tasks.not_a_task", "it names a function, not a django.tasks.Task"),
        ("os.system; rm -rf", "not a dotted import path"),
    ],
)
def test_unresolvable_task_gives_a_readable_stand_in(backend, make_job, task_path, problem):
    job = make_job(task_path=task_path, state="succeeded", return_value=1, finished_at=timezone.now())
    result = backend.get_result(str(job.pk))
    assert isinstance(result.task, UnresolvedTask)
    assert problem in result.task.problem
    assert result.task.module_path == task_path
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 1)
    with pytest.raises(InvalidTask, match="cannot be used"):
        result.task.enqueue(1)
    with pytest.raises(InvalidTask, match="cannot be used"):
        result.task.call(1)
    result.refresh()  # still works: the stand-in knows its backend


@pytest.mark.django_db
def test_malformed_payload_gives_empty_arguments(backend, make_job):
    job = make_job(payload=["not", "an", "object"], state="quarantined")
    result = backend.get_result(str(job.pk))
    assert (result.args, result.kwargs) == ([], {})


def test_task_result_for_attempt_builds_the_workers_view():
    now = timezone.now()
    result = task_result_for_attempt(
        task=sample_tasks.with_context,
        job_id=12,
        attempt=3,
        worker_id="w3",
        payload={"args": [5], "kwargs": {}},
        backend="default",
        enqueued_at=now,
        started_at=now,
        attempted_at=now,
        earlier_worker_ids=["w1"],
    )
    assert (result.id, result.status, result.args) == ("12", TaskResultStatus.RUNNING, [5])
    assert result.worker_ids == ["w1", "", "w3"]
    assert result.attempts == 3


@pytest.mark.django_db
def test_get_result_survives_a_queue_removed_from_settings(settings):
    enqueued = sample_tasks.send_email.using(priority=1).enqueue("a@example.com")
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": ["default"]}}
    from django.tasks import task_backends

    result = task_backends["default"].get_result(enqueued.id)
    assert result.status == TaskResultStatus.READY
    assert result.task.func is sample_tasks.send_email.func


ENQUEUES = {
    "plain": lambda: sample_tasks.add.enqueue(1, b=2),
    "options": lambda: sample_tasks.charge.using(priority=3, max_attempts=2).enqueue(7),
    "deferred": lambda: sample_tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2),
    "run_after in the past": lambda: sample_tasks.add.using(run_after=timezone.now() - timedelta(hours=1)).enqueue(1, 2),
    "enqueue_many": lambda: backwave.enqueue_many([(sample_tasks.send_email, ("a@example.com",), {"subject": "hi"})])[0],
    "unique, new": lambda: sample_tasks.sync_order.enqueue(order_id=5),
}


@pytest.mark.django_db
@pytest.mark.parametrize("how", list(ENQUEUES))
def test_enqueue_hands_back_what_get_result_reads_for_the_untouched_job(backend, how):
    # Django's contract (its tests/tasks): one class, the stored enqueued_at, the same task.
    enqueued = ENQUEUES[how]()
    read = backend.get_result(enqueued.id)
    assert read == enqueued
    assert enqueued.enqueued_at == Job.objects.get(pk=int(enqueued.id)).enqueued_at
    assert type(read) is type(enqueued)


@pytest.mark.django_db(transaction=True)
def test_aenqueue_hands_back_what_aget_result_reads(backend):
    enqueued = async_to_sync(sample_tasks.add.aenqueue)(1, 2)
    assert async_to_sync(backend.aget_result)(enqueued.id) == enqueued


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["refresh", "arefresh"])
def test_refreshing_a_result_is_one_query(backend, make_job, how):
    job = make_job(state="failed", attempts=2, max_attempts=2, finished_at=timezone.now())
    Attempt.objects.create(job=job, number=1, state="failed", worker_id="w1", error_class="builtins.KeyError", traceback="tb1")
    result = backend.get_result(str(job.pk))
    Attempt.objects.create(job=job, number=2, state="failed", worker_id="w2", error_class="builtins.ValueError", traceback="tb2")
    Job.objects.filter(pk=job.pk).update(progress={"done": 2}, metadata={"k": "v"})

    with CaptureQueriesContext(connection) as queries:
        result.refresh() if how == "refresh" else async_to_sync(result.arefresh)()

    assert len(queries) == 1, [q["sql"] for q in queries]
    assert [error.traceback for error in result.errors] == ["tb1", "tb2"]
    assert (result.worker_ids, result.progress, result.metadata) == (["w1", "w2"], {"done": 2}, {"k": "v"})


@pytest.mark.django_db
def test_get_result_is_one_query(backend, make_job):
    job = make_job(state="failed", attempts=1, finished_at=timezone.now())
    Attempt.objects.create(job=job, number=1, state="failed", worker_id="w1", error_class="builtins.KeyError", traceback="tb1")
    with CaptureQueriesContext(connection) as queries:
        result = backend.get_result(str(job.pk))
    assert len(queries) == 1
    assert [error.exception_class for error in result.errors] == [KeyError]

"""Enqueue: one INSERT on Django's connection, inside the caller's transaction."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from backwave.models import Job
from backwave.tasking.task import TaskCall, aenqueue_many, enqueue_many

from . import sample_tasks


class Boom(Exception):
    pass


@pytest.mark.django_db
def test_enqueue_writes_one_row_with_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        result = sample_tasks.add.enqueue(1, b=2)
    job = Job.objects.get(pk=int(result.id))
    assert job.task_path == "tests.backend.sample_tasks.add"
    assert job.payload == {"args": [1], "kwargs": {"b": 2}}
    assert (job.queue, job.priority, job.state, job.backend) == ("default", 0, "ready", "default")
    assert (job.attempts, job.max_attempts, job.backoff_base, job.backoff_max) == (0, 3, 1.0, 3600.0)
    assert job.tags == []
    assert job.run_at == job.enqueued_at  # due at once, by the database clock
    assert job.lease_id is None and job.worker_id == ""


@pytest.mark.django_db
def test_enqueue_returns_a_ready_result():
    before = timezone.now()
    result = sample_tasks.add.enqueue(1, 2)
    assert result.status == TaskResultStatus.READY
    assert result.task is sample_tasks.add
    assert result.id == str(Job.objects.get().pk)
    assert (result.args, result.kwargs) == ([1, 2], {})
    assert result.backend == "default"
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert result.enqueued_at >= before
    assert result.started_at is result.finished_at is result.last_attempted_at is None
    assert not result.is_finished


@pytest.mark.django_db
def test_task_options_land_in_the_row():
    when = timezone.now() + timedelta(hours=2)
    result = sample_tasks.charge.using(priority=-7, queue_name="reports", run_after=when).enqueue(42)
    job = Job.objects.get(pk=int(result.id))
    assert (job.queue, job.priority, job.run_at) == ("reports", -7, when)
    assert (job.max_attempts, job.backoff_base, job.backoff_max) == (5, 2.0, 60.0)
    assert job.tags == ["billing", "nightly"]


@pytest.mark.django_db
def test_decorator_queue_and_priority_land_in_the_row():
    job = Job.objects.get(pk=int(sample_tasks.send_email.enqueue("a@example.com").id))
    assert (job.queue, job.priority) == ("emails", 10)


@pytest.mark.django_db
def test_settings_and_backend_options_give_the_defaults(settings):
    settings.BACKWAVE = {"DEFAULT_MAX_ATTEMPTS": 9, "DEFAULT_BACKOFF_BASE": 0.5}
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"DEFAULT_BACKOFF_MAX": 10}}}
    job = Job.objects.get(pk=int(sample_tasks.add.enqueue(1, 2).id))
    assert (job.max_attempts, job.backoff_base, job.backoff_max) == (9, 0.5, 10.0)


@pytest.mark.django_db
def test_task_enqueued_signal_fires_with_the_result():
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = sample_tasks.add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(receiver)
    assert received == [(type(task_backends["default"]), result)]


@pytest.mark.django_db
def test_aenqueue_writes_the_row():
    result = async_to_sync(sample_tasks.add.aenqueue)(3, 4)
    assert Job.objects.get(pk=int(result.id)).payload == {"args": [3, 4], "kwargs": {}}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs", "offender"),
    [
        (({1, 2},), {}, "is a set"),
        ((), {"when": timezone.now()}, "is a datetime.datetime"),
        ((object(),), {}, "is a object"),
        # What jsonb refuses although json.dumps writes it: found at enqueue, not by the server.
        (("caf\udce9",), {}, r"\['args'\]\[0\] contains a lone surrogate"),
        ((), {"name": {"x\ud800": 1}}, "has a key with a lone surrogate"),
    ],
)
def test_non_json_arguments_raise_and_write_nothing(django_assert_num_queries, args, kwargs, offender):
    with django_assert_num_queries(0), pytest.raises(InvalidTask, match=offender):
        sample_tasks.add.enqueue(*args, **kwargs)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_oversized_payload_raises_and_writes_nothing(settings):
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"MAX_PAYLOAD_BYTES": 1000}}}
    sample_tasks.add.enqueue("x" * 900, "")
    with pytest.raises(InvalidTask, match=r"encode to 1,032 bytes of JSON; the limit is 1,000"):
        sample_tasks.add.enqueue("x" * 1000, "")
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_default_payload_limit_is_one_mebibyte():
    with pytest.raises(InvalidTask, match="the limit is 1,048,576"):
        sample_tasks.add.enqueue("x" * (1024 * 1024), "")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_queue_removed_from_settings_is_rejected_at_enqueue(settings):
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": ["default"]}}
    with pytest.raises(InvalidTask, match="Queue 'emails' is not valid for backend"):
        sample_tasks.send_email.enqueue("a@example.com")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_unknown_queue_raises(settings):
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid for backend"):
        sample_tasks.add.using(queue_name="nope").enqueue(1, 2)


@pytest.mark.django_db
def test_takes_context_task_enqueues_without_the_context_argument():
    job = Job.objects.get(pk=int(sample_tasks.with_context.enqueue(5).id))
    assert job.payload == {"args": [5], "kwargs": {}}


@pytest.mark.django_db
def test_plain_django_task_on_the_backend_gets_the_defaults():
    from django.tasks import Task

    plain = Task(func=sample_tasks.undecorated)
    job = Job.objects.get(pk=int(plain.enqueue(1, 2).id))
    assert (job.max_attempts, job.tags) == (3, [])


# --- transactions -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rolled_back_transaction_leaves_no_job():
    with pytest.raises(Boom), transaction.atomic():
        sample_tasks.add.enqueue(1, 2)
        assert Job.objects.count() == 1  # visible inside the transaction
        raise Boom
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_job_is_invisible_to_other_sessions_until_commit(other_session):
    def jobs_seen_elsewhere():
        return other_session.execute("SELECT count(*) FROM backwave_job").fetchone()[0]

    with transaction.atomic():
        result = sample_tasks.add.enqueue(1, 2)
        assert jobs_seen_elsewhere() == 0
    assert jobs_seen_elsewhere() == 1
    assert other_session.execute("SELECT id FROM backwave_job").fetchone()[0] == int(result.id)


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_autocommit_is_visible_at_once(other_session):
    sample_tasks.add.enqueue(1, 2)
    assert other_session.execute("SELECT count(*) FROM backwave_job").fetchone()[0] == 1


# --- many -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_many_is_one_insert_for_a_thousand_tasks(django_assert_num_queries):
    calls = [(sample_tasks.add, (i, i), {}) for i in range(1000)]
    with django_assert_num_queries(1):
        results = enqueue_many(calls)
    assert [result.args for result in results] == [[i, i] for i in range(1000)]
    ids = [int(result.id) for result in results]
    assert ids == sorted(ids)  # input order
    assert dict(Job.objects.values_list("pk", "payload")) == {ids[i]: {"args": [i, i], "kwargs": {}} for i in range(1000)}


@pytest.mark.django_db
def test_enqueue_many_mixes_tasks_and_options():
    results = enqueue_many(
        [
            TaskCall(sample_tasks.add, (1, 2)),
            (sample_tasks.charge.using(queue_name="reports"), (7,), {}),
            (sample_tasks.send_email, ("a@example.com",), {"subject": "hi"}),
        ]
    )
    jobs = Job.objects.in_bulk([int(result.id) for result in results])
    rows = [jobs[int(result.id)] for result in results]
    assert [(job.task_path.rsplit(".", 1)[1], job.queue, job.max_attempts) for job in rows] == [
        ("add", "default", 3),
        ("charge", "reports", 5),
        ("send_email", "emails", 3),
    ]
    assert [result.task for result in results][0] is sample_tasks.add


@pytest.mark.django_db
def test_enqueue_many_validates_everything_before_writing(django_assert_num_queries):
    calls = [(sample_tasks.add, (i, i), {}) for i in range(10)] + [(sample_tasks.add, ({1},), {})]
    with django_assert_num_queries(0), pytest.raises(InvalidTask, match="is a set"):
        enqueue_many(calls)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many_rejects_malformed_calls(backend):
    with pytest.raises(InvalidTask, match=r"call #1 must be a \(task, args, kwargs\) tuple"):
        backend.enqueue_many([(sample_tasks.add, (1, 2), {}), sample_tasks.add])
    with pytest.raises(InvalidTask, match=r"call #0 .* whose task is a django.tasks.Task"):
        enqueue_many([(sample_tasks.not_a_task, (1,), {})])
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many_needs_one_backend(settings):
    settings.TASKS = {**settings.TASKS, "other": {**settings.TASKS["default"]}}
    with pytest.raises(InvalidTask, match=r"tasks use backends \['default', 'other'\]; call it once per backend"):
        enqueue_many([(sample_tasks.add, (1, 2), {}), (sample_tasks.add.using(backend="other"), (1, 2), {})])
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_backend_enqueue_many_refuses_another_backends_task(settings):
    settings.TASKS = {**settings.TASKS, "other": {**settings.TASKS["default"]}}
    with pytest.raises(InvalidTask, match="uses backend 'other', not 'default'"):
        task_backends["default"].enqueue_many([(sample_tasks.add.using(backend="other"), (1, 2), {})])


@pytest.mark.django_db
def test_second_backend_alias_writes_its_alias(settings):
    settings.TASKS = {**settings.TASKS, "other": {**settings.TASKS["default"]}}
    result = sample_tasks.add.using(backend="other").enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).backend == "other"
    assert task_backends["other"].get_result(result.id).backend == "other"
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result.id)


@pytest.mark.django_db
def test_enqueue_many_of_nothing_writes_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert enqueue_many([]) == []


@pytest.mark.django_db
def test_enqueue_many_sends_one_signal_per_job():
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        results = enqueue_many([(sample_tasks.add, (i, i), {}) for i in range(3)])
    finally:
        task_enqueued.disconnect(receiver)
    assert received == [result.id for result in results]


@pytest.mark.django_db
def test_aenqueue_many_writes_the_rows():
    results = async_to_sync(aenqueue_many)([(sample_tasks.add, (1, 2), {}), (sample_tasks.add, (3, 4), {})])
    assert Job.objects.filter(pk__in=[int(result.id) for result in results]).count() == 2


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_rolls_back_with_the_transaction():
    with pytest.raises(Boom), transaction.atomic():
        enqueue_many([(sample_tasks.add, (i, i), {}) for i in range(5)])
        raise Boom
    assert not Job.objects.exists()

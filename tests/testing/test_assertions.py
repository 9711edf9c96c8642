"""assert_enqueued, refute_enqueued, capture_enqueued and the backwave_jobs fixture."""

from __future__ import annotations

import pytest
from django.db import transaction

from backwave.tasking.task import enqueue_many
from backwave.testing import DeterministicPump, all_enqueued, assert_enqueued, capture_enqueued, refute_enqueued

from . import tasks

pytestmark = pytest.mark.django_db


def test_assert_enqueued_matches_task_args_and_queue():
    tasks.send_email.enqueue("a@example.com", subject="hi")

    job = assert_enqueued(tasks.send_email, args=["a@example.com"], queue="emails")
    assert (job.task_path, job.kwargs, job.state) == (tasks.send_email.module_path, {"subject": "hi"}, "ready")
    assert_enqueued(tasks.send_email.module_path)  # the import path works as well as the task
    assert_enqueued(kwargs={"subject": "hi"})  # any task; kwargs match on the keys given


def test_a_near_miss_shows_what_is_there():
    tasks.send_email.enqueue("a@example.com")
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(tasks.send_email, args=["b@example.com"])
    message = str(caught.value)
    assert (
        "Expected a job of 'tests.testing.tasks.send_email' with args=['b@example.com'], state='ready' to be enqueued" in message
    )
    assert "args=['a@example.com']" in message and "queue='emails'" in message


def test_refute_enqueued_lists_what_it_found():
    tasks.add.enqueue(1, 2)
    refute_enqueued(tasks.add, args=[2, 1])
    refute_enqueued(tasks.send_email)
    with pytest.raises(
        AssertionError,
        match=r"Expected no a job of 'tests.testing.tasks.add'.* found 1:\n  #\d+ tests.testing.tasks.add\(args=\[1, 2\]",
    ):
        refute_enqueued(tasks.add)


def test_a_rolled_back_enqueue_is_not_enqueued():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise RuntimeError("the request failed")
    refute_enqueued(tasks.add)


def test_state_filters_and_a_job_that_already_ran():
    tasks.add.enqueue(1, 2)
    with DeterministicPump(tasks=[tasks]) as pump:
        pump.drain()
    refute_enqueued(tasks.add)  # enqueued means ready, not yet run
    assert assert_enqueued(tasks.add, state="succeeded").attempts == 1
    assert [job.state for job in all_enqueued(tasks.add, state=None)] == ["succeeded"]


def test_priority_and_tags_filters():
    tasks.add.using(priority=7, tags=("billing", "eu")).enqueue(1, 1)
    assert_enqueued(tasks.add, priority=7, tags=["eu"])
    refute_enqueued(tasks.add, priority=6)
    refute_enqueued(tasks.add, tags=["us"])


def test_capture_collects_only_the_jobs_of_its_block_in_order():
    tasks.add.enqueue(0, 0)
    with capture_enqueued() as jobs:
        tasks.send_email.enqueue("a@example.com")
        enqueue_many([(tasks.add, (1, 1), {}), (tasks.add, (2, 2), {})])
        assert jobs == []  # filled when the block ends
    tasks.add.enqueue(3, 3)
    assert [(job.task_path.rsplit(".", 1)[1], job.args) for job in jobs] == [
        ("send_email", ["a@example.com"]),
        ("add", [1, 1]),
        ("add", [2, 2]),
    ]


def test_a_task_that_is_not_a_task_is_refused():
    with pytest.raises(TypeError, match="pass a Task"):
        assert_enqueued(print)


def test_the_fixture(backwave_jobs):
    with backwave_jobs.capture() as jobs:
        tasks.add.enqueue(5, 5)
    assert len(jobs) == 1
    assert backwave_jobs.assert_enqueued(tasks.add, args=[5, 5]).id == jobs[0].id
    backwave_jobs.refute_enqueued(tasks.send_email)
    assert len(backwave_jobs.all()) == 1

"""backwave.ops.actions and manage.py backwave_queue: one conditional statement per operation."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from backwave.ops import actions as operations
from backwave.models import Job, Queue

from .conftest import make_job

pytestmark = pytest.mark.django_db


def test_retry_reports_what_it_changed_and_what_it_refused():
    failed = make_job(state="failed", attempts=2, max_attempts=2)
    running = make_job(state="running")
    ready = make_job()

    result = operations.retry_job_ids([failed.pk, running.pk, ready.pk, 10**12])

    assert result.changed == (failed.pk,)
    assert dict(result.refused) == {"running": 1, "ready": 1}
    failed.refresh_from_db()
    assert (failed.state, failed.attempts, failed.max_attempts, failed.lease_id) == ("ready", 2, 3, None)


def test_retry_grants_one_more_counted_attempt_to_a_job_with_forgiven_ones():
    """A job that killed its worker: four tries, the first forgiven (it lapsed beside others), three
    counted. Retry now gives it one more counted attempt, not two."""
    crasher = make_job(state="failed", attempts=4, forgiven_attempts=1, max_attempts=3, suspect=True)
    assert operations.retry_job_ids([crasher.pk]).changed == (crasher.pk,)
    crasher.refresh_from_db()
    assert (crasher.state, crasher.attempts, crasher.forgiven_attempts, crasher.max_attempts, crasher.suspect) == (
        "ready",
        4,
        1,
        4,
        True,
    )


def test_cancel_leaves_running_jobs_to_their_lease():
    running = make_job(state="running")
    result = operations.cancel_job_ids([running.pk])
    assert result.changed == ()
    assert result.refused_running == 1
    assert Job.objects.get(pk=running.pk).state == "running"


def test_queue_operations_create_rows_and_touch_only_their_column():
    operations.limit_queues(["emails"], 5)
    operations.pause_queues(["emails", "reports"])
    operations.resume_queues(["reports"])
    rows = {q.name: (q.paused, q.concurrency_limit) for q in Queue.objects.all()}
    assert rows == {"emails": (True, 5), "reports": (False, None)}
    assert all(q.updated_at is not None for q in Queue.objects.all())


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "semi;colon", "ünïcode", None])
def test_invalid_queue_names_are_refused(name):
    with pytest.raises(ValueError, match="Invalid queue name"):
        operations.pause_queues([name])
    assert not Queue.objects.exists()


@pytest.mark.parametrize("limit", [0, -1, 1.5, "3", True, 2**31, 10**30])
def test_invalid_limits_are_refused(limit):
    with pytest.raises(ValueError, match="Invalid concurrency limit"):
        operations.limit_queues(["emails"], limit)


def test_the_largest_limit_the_column_holds_is_accepted():
    operations.limit_queues(["emails"], 2**31 - 1)
    assert Queue.objects.get(name="emails").concurrency_limit == 2**31 - 1


def test_a_job_asked_for_by_id_that_no_longer_exists_is_reported_gone():
    failed = make_job(state="failed")
    result = operations.retry_job_ids([failed.pk, 10**12])
    assert (result.changed, dict(result.refused), result.gone) == ((failed.pk,), {}, (10**12,))


def test_the_database_refuses_a_bad_row_too():
    with pytest.raises(IntegrityError), transaction.atomic():
        Queue.objects.create(name="bad name")
    with pytest.raises(IntegrityError), transaction.atomic():
        Queue.objects.create(name="ok", concurrency_limit=0)


def test_command_pause_resume_limit_and_list(capsys):
    call_command("backwave_queue", "pause", "emails")
    call_command("backwave_queue", "limit", "emails", "3")
    call_command("backwave_queue", "list")
    out = capsys.readouterr().out
    assert "Paused emails" in out
    assert "emails: at most 3 running at once, cluster-wide." in out
    assert ["default", "emails", "paused", "3"] in [line.split()[:4] for line in out.splitlines()]

    call_command("backwave_queue", "resume", "emails")
    call_command("backwave_queue", "limit", "emails")
    assert Queue.objects.filter(name="emails", paused=False, concurrency_limit=None).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pause", "no way"], "Invalid queue name 'no way'"),
        (["limit", "emails", "0"], "Invalid concurrency limit '0'"),
        (["limit", "emails", "lots"], "Invalid concurrency limit 'lots'"),
        (["limit", "emails", "2147483648"], "Invalid concurrency limit '2147483648': use a whole number from 1 to 2,147,483,647"),
        (["limit", "emails", "²"], "Invalid concurrency limit '²'"),
        (["limit", "emails", "٣"], "Invalid concurrency limit '٣'"),
    ],
)
def test_command_errors_name_the_mistake(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("backwave_queue", *args)
    assert not Queue.objects.exists()

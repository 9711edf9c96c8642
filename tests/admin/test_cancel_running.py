"""The admin's Cancel of a running job: its own permission, a request the worker acts on, and
what the pages show of it (the whole path through a real worker: tests/shell/test_attempt_control_e2e.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from backwave.models import Job

from .conftest import make_job
from .test_jobs_admin import change_url, messages_of, run_action

pytestmark = pytest.mark.django_db


@pytest.fixture
def canceller_client(operator_client, operator_user):
    operator_user.user_permissions.add(Permission.objects.get(codename="cancel_running_job"))
    return operator_client


def test_with_the_permission_a_running_job_gets_a_cancel_request_naming_the_operator(canceller_client):
    running, due = make_job(state="running"), make_job()
    response = run_action(canceller_client, "cancel", running, due)
    assert messages_of(response) == ["Asked the worker of 1 running job to stop; it ends cancelled.", "Cancelled 1 job."]
    job = Job.objects.get(pk=running.pk)
    assert job.state == "running"  # its worker ends it
    assert (job.cancel_requested_by, job.cancel_requested_at is not None) == ("admin:operator", True)
    assert Job.objects.get(pk=due.pk).state == "cancelled"
    # A second click changes nothing: the first request's author stays.
    run_action(canceller_client, "cancel", running)
    assert Job.objects.get(pk=running.pk).cancel_requested_by == "admin:operator"
    content = canceller_client.get(change_url(running)).content.decode()
    assert "Cancel requested by admin:operator" in content


def test_without_it_running_jobs_are_left_alone(operator_client):
    running = make_job(state="running")
    response = run_action(operator_client, "cancel", running)
    assert messages_of(response) == ["1 job is running under a worker's lease and was left alone: try again once it finishes."]
    assert Job.objects.get(pk=running.pk).cancel_requested_at is None


def test_the_list_shows_a_running_jobs_progress(operator_client):
    make_job(state="running", progress={"page": 3, "of": 10})
    content = operator_client.get("/admin/backwave/job/").content.decode()
    assert "bw-progress" in content and "&quot;page&quot;: 3" in content


def test_the_api_cancels_a_ready_job_at_once_and_asks_a_running_ones_worker():
    import backwave
    from django.tasks.exceptions import TaskResultDoesNotExist

    ready, running, done = make_job(), make_job(state="running"), make_job(state="succeeded")
    assert backwave.cancel(str(ready.pk)) == backwave.Cancellation.CANCELLED
    assert backwave.cancel(running.pk, by="billing-cleanup") == backwave.Cancellation.REQUESTED
    assert backwave.cancel(done.pk) == backwave.Cancellation.FINISHED
    assert Job.objects.get(pk=ready.pk).cancel_requested_by == "api"
    assert Job.objects.get(pk=running.pk).cancel_requested_by == "billing-cleanup"
    for missing in ("999999", "abc", "-1"):
        with pytest.raises(TaskResultDoesNotExist):
            backwave.cancel(missing)


@pytest.mark.parametrize("by", ["a\x00b", "a\ud800b", "", "x" * 256, 5, None])
@pytest.mark.parametrize("state", ["ready", "running"])
def test_the_api_refuses_a_by_the_database_cannot_hold_before_any_sql(by, state, django_assert_num_queries):
    """by="a\x00b" reached the UPDATE: a raw DataError that aborted the caller's transaction."""
    from django.db import connection, transaction

    import backwave

    job = make_job(state=state)
    with transaction.atomic():
        with (
            django_assert_num_queries(0),
            pytest.raises(ValueError, match=r"by of backwave.cancel\(\) must be a string of 1 to 255 characters"),
        ):
            backwave.cancel(job.pk, by=by)
        assert Job.objects.get(pk=job.pk).state == state  # the transaction still answers
    assert Job.objects.get(pk=job.pk).cancel_requested_by == ""
    assert not connection.needs_rollback


def test_the_command_cancels_by_id_and_says_what_it_did():
    from io import StringIO

    from django.core.management import CommandError, call_command

    ready, running = make_job(), make_job(state="running")
    out = StringIO()
    call_command("backwave_cancel", str(ready.pk), str(running.pk), "--by", "ops", stdout=out)
    assert out.getvalue().splitlines() == [
        f"job {ready.pk}: cancelled",
        f"job {running.pk}: running; its worker was asked to stop it, and ends it cancelled",
    ]
    assert Job.objects.get(pk=running.pk).cancel_requested_by == "ops"
    other = make_job(state="running")
    out = StringIO()
    call_command("backwave_cancel", str(other.pk), "--ready-only", stdout=out)
    assert out.getvalue().splitlines() == ["1 job(s) left alone: running"]
    with pytest.raises(CommandError, match="no such job: 424242"):
        call_command("backwave_cancel", "424242", stdout=StringIO())

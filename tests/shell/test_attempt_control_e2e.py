"""Attempt control with the real worker command in a subprocess, against the real database:
time limits, cancelling a running job (from the admin), snooze, discard, progress."""

from __future__ import annotations

import signal

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

import backwave
from backwave.models import Attempt, Job
from tests.shell import worker_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.5", "--log-every", "0.5")


def _attempts(job_id):
    return list(Attempt.objects.filter(job_id=job_id).order_by("number"))


def test_a_timed_out_attempt_is_retried_while_its_thread_goes_on(start_worker):
    result = worker_tasks.overruns_first_attempt.enqueue()
    worker = start_worker("--queues", "e2e", "--pool-size", "2", *FAST)
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "succeeded", what="the retry succeeding")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    first, second = _attempts(result.id)
    assert (first.state, first.error_class) == ("failed", "backwave.TimeLimitExceeded")
    assert "ran past its time limit" in first.traceback
    assert second.state == "succeeded"
    assert Job.objects.get(id=result.id).return_value["attempt"] == 2


def test_a_handler_past_its_hard_limit_costs_its_process_and_a_fresh_one_runs_the_retry(start_worker):
    result = worker_tasks.hangs_on_first_attempt.enqueue()
    worker = start_worker("--queues", "e2e", "--processes", "1", "--hard-time-limits", "0.5", "--drain-timeout", "2", *FAST)
    worker.wait_for(
        lambda: Job.objects.get(id=result.id).state == "succeeded", timeout=60, what="the retry succeeding in a new process"
    )
    worker.signal(signal.SIGTERM)
    worker.wait()
    first, second = _attempts(result.id)
    assert first.error_class == "backwave.TimeLimitExceeded"
    first_pid = int(first.worker_id.split(":")[1])
    assert Job.objects.get(id=result.id).return_value != first_pid  # the retry ran in the replacement
    assert "ends itself" in worker.output and "replacing it" in worker.output


def test_a_running_job_cancelled_from_the_admin_ends_cancelled(start_worker):
    result = worker_tasks.runs_until_cancelled.enqueue()
    # A heartbeat every 100 s and 60 s of grace: a cancel seen within the 30 s wait below came
    # through the NOTIFY, and the handler's own stop (not the grace) ended it.
    worker = start_worker("--queues", "e2e", "--lease-duration", "300", "--cancel-grace", "60", *FAST)
    # The first progress lands with the outcome or a heartbeat; with 100 s between heartbeats,
    # wait for the job to run instead, then let one heartbeat-free cancel prove the fast path.
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "running", what="the job starting", timeout=30)
    assert worker_tasks.runs_until_cancelled.get_result(result.id).status == "RUNNING"
    operator = User.objects.create_user("alice", password="pw", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_job", "cancel_job", "cancel_running_job"]))
    client = Client()
    client.force_login(operator)
    response = client.post(
        reverse("admin:backwave_job_changelist"), {"action": "cancel", "_selected_action": [result.id]}, follow=True
    )
    assert "ends cancelled" in response.content.decode()
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "cancelled", what="the job ending cancelled", timeout=30)
    (attempt,) = _attempts(result.id)
    assert (attempt.state, attempt.error_class) == ("cancelled", "backwave.Cancelled")
    assert "cancelled by admin:alice" in attempt.traceback
    assert "did not stop in time" not in attempt.traceback  # its handler stopped on its own
    final = worker_tasks.runs_until_cancelled.get_result(result.id)
    assert final.status == "FAILED"  # Django has no cancelled status
    assert [e.exception_class_path for e in final.errors] == ["backwave.Cancelled"]
    assert final.metadata["last_step"] >= 0
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_progress_is_readable_while_the_job_runs_and_a_cancel_reaches_the_worker_through_the_heartbeat(start_worker):
    result = worker_tasks.runs_until_cancelled.enqueue()
    worker = start_worker("--queues", "e2e", "--no-hints", "--lease-duration", "3", *FAST)
    # Written with the heartbeat (every second here), never a statement per set_progress().
    worker.wait_for(lambda: Job.objects.get(id=result.id).progress is not None, what="the job reporting progress")
    running = worker_tasks.runs_until_cancelled.get_result(result.id)
    assert running.status == "RUNNING" and running.progress["step"] >= 0 and running.metadata == {}
    first = running.progress["step"]
    worker.wait_for(lambda: Job.objects.get(id=result.id).progress["step"] > first, what="the progress moving on")
    assert backwave.cancel(result.id, by="api") == backwave.Cancellation.REQUESTED
    worker.wait_for(lambda: Job.objects.get(id=result.id).state == "cancelled", what="the job ending cancelled", timeout=30)
    assert "cancelled by api" in _attempts(result.id)[0].traceback
    assert backwave.cancel(result.id) == backwave.Cancellation.FINISHED
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_snooze_and_discard(start_worker):
    snoozed = worker_tasks.snoozes_once.enqueue()
    discarded = worker_tasks.discards.enqueue()
    worker = start_worker("--queues", "e2e", *FAST)  # not --until-idle: a snoozed job is not due
    worker.wait_for(lambda: Job.objects.get(id=snoozed.id).state == "succeeded", what="the snoozed job succeeding")
    worker.wait_for(lambda: Job.objects.get(id=discarded.id).state == "failed", what="the discarded job failing")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    snooze, run = _attempts(snoozed.id)
    assert (snooze.state, snooze.error_class, run.state) == ("snoozed", "backwave.Snooze", "succeeded")
    job = Job.objects.get(id=snoozed.id)
    assert (job.attempts, job.forgiven_attempts, job.max_attempts, job.return_value) == (2, 1, 1, 2)
    (discard,) = _attempts(discarded.id)  # five attempts allowed, one made
    assert (discard.state, discard.error_class) == ("failed", "backwave.Discard")
    assert "the customer is gone" in discard.traceback

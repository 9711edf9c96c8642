"""The admin with two databases (the test settings' "default" and "other", where the "remote"
backend enqueues): it shows one at a time, the one chosen with the switch and kept in the
session, and every page and action reads and writes that one."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.db import connections
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from backwave.models import Job, Queue
from tests.shell.worker_tasks import noop

pytestmark = pytest.mark.django_db(databases=["default", "other"])

INDEX = reverse("admin:app_list", kwargs={"app_label": "backwave"})
JOBS = reverse("admin:backwave_job_changelist")
QUEUES = reverse("admin:backwave_queue_changelist")
STATS = reverse("admin:backwave_taskstat_changelist")
SESSION_KEY = "backwave_database"  # where the admin keeps the choice


def switch() -> str:
    return reverse("admin:backwave_database_switch")


def local_job(n: int = 1) -> Job:
    return Job.objects.get(pk=int(noop.enqueue(n).id))


def remote_job(n: int = 2) -> Job:
    """A job of the "remote" backend: it lives in "other" only."""
    return Job.objects.using("other").get(pk=int(noop.using(backend="remote", queue_name="remote").enqueue(n).id))


def failed(job: Job) -> Job:
    Job.objects.using(job._state.db).filter(pk=job.pk).update(state="failed", finished_at=Now(), attempts=1)
    return Job.objects.using(job._state.db).get(pk=job.pk)


def select(client, alias: str) -> None:
    session = client.session
    session[SESSION_KEY] = alias
    session.save()


def listed(client) -> list[tuple[int, str, list]]:
    response = client.get(JOBS)
    assert response.status_code == 200
    return [(job.pk, job._state.db, job.payload["args"]) for job in response.context["cl"].result_list]


def texts(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_the_jobs_list_shows_the_selected_databases_jobs(operator_client):
    local, remote = local_job(1), remote_job(2)
    assert listed(operator_client) == [(local.pk, "default", [1])]  # the router's database first
    select(operator_client, "other")
    assert listed(operator_client) == [(remote.pk, "other", [2])]
    select(operator_client, "default")
    assert listed(operator_client) == [(local.pk, "default", [1])]


def test_a_job_page_reads_the_selected_database(operator_client):
    remote = remote_job(424242)
    select(operator_client, "other")
    response = operator_client.get(reverse("admin:backwave_job_change", args=[remote.pk]))
    assert response.status_code == 200
    assert response.context["original"]._state.db == "other"
    assert "424242" in response.content.decode()


def test_the_queues_page_and_the_dashboard_count_the_selected_database(operator_client):
    local_job(1)
    remote_job(2)
    remote_job(3)
    select(operator_client, "other")
    lines = {line.name: line for line in operator_client.get(QUEUES).context["lines"]}
    assert lines["remote"].counts["ready"].value == 2
    assert "e2e" not in lines  # a queue of the other database only
    board = operator_client.get(INDEX).context["board"]
    queues = {health.line.name: health.line.counts["ready"].value for health in board.queues}
    assert queues.get("remote") == 2 and "e2e" not in queues


def test_the_task_statistics_page_reads_the_selected_database(admin_client):
    select(admin_client, "other")
    with CaptureQueriesContext(connections["other"]) as other:
        assert admin_client.get(STATS).status_code == 200
    assert any("backwave_task_stat" in query["sql"] for query in other.captured_queries)


def test_job_actions_write_the_selected_database(operator_client):
    local = failed(local_job(1))
    remote = failed(remote_job(2))
    select(operator_client, "other")
    response = operator_client.post(JOBS, {"action": "retry_now", "_selected_action": [remote.pk]}, follow=True)
    assert "Retried 1 job." in texts(response)
    assert Job.objects.using("other").get(pk=remote.pk).state == "ready"
    assert Job.objects.get(pk=local.pk).state == "failed"
    # The job page's own action, and "retry all matching".
    remote = failed(Job.objects.using("other").get(pk=remote.pk))
    change = reverse("admin:backwave_job_change", args=[remote.pk])
    operator_client.post(change, {"CHANGE_FORM-action": "retry_now", "_selected_action": remote.pk})
    assert Job.objects.using("other").get(pk=remote.pk).state == "ready"
    failed(Job.objects.using("other").get(pk=remote.pk))
    bulk = reverse("admin:backwave_job_bulk", args=["retry-all"])
    assert operator_client.get(bulk, {"state": "failed"}).context["count"] == 1
    operator_client.post(f"{bulk}?state=failed")
    assert Job.objects.using("other").get(pk=remote.pk).state == "ready"
    assert Job.objects.get(pk=local.pk).state == "failed"


def test_queue_actions_write_the_selected_database(operator_client):
    select(operator_client, "other")
    operator_client.post(QUEUES, {"action": "pause", "_selected_action": ["remote"]})
    assert Queue.objects.using("other").get(name="remote").paused
    assert not Queue.objects.filter(name="remote").exists()
    operator_client.post(QUEUES, {"action": "set_limit", "limit": "3", "_selected_action": ["remote"]})
    assert Queue.objects.using("other").get(name="remote").concurrency_limit == 3


def test_the_switch_lists_the_backends_databases_and_keeps_the_choice_in_the_session(operator_client):
    html = operator_client.get(JOBS).content.decode()
    assert 'id="bw-database-switch"' in html
    assert '<option value="default" selected>default</option>' in html and '<option value="other">other</option>' in html
    response = operator_client.post(switch(), {"database": "other", "next": f"{QUEUES}?x=1"})
    assert response.status_code == 302 and response["Location"] == f"{QUEUES}?x=1"
    assert operator_client.session[SESSION_KEY] == "other"
    assert '<option value="other" selected>other</option>' in operator_client.get(INDEX).content.decode()


def test_switching_from_a_job_page_goes_to_the_jobs_list(operator_client):
    """Job ids are per database: job 7 of one database is another job than job 7 of the other."""
    local = local_job()
    response = operator_client.post(
        switch(), {"database": "other", "next": reverse("admin:backwave_job_change", args=[local.pk])}
    )
    assert response["Location"] == JOBS


@pytest.mark.parametrize("data", [{"database": "nope"}, {"database": ""}, {}, {"database": "other\x00"}])
def test_a_database_the_backends_do_not_use_is_refused_with_a_message(operator_client, data):
    select(operator_client, "other")
    response = operator_client.post(switch(), {**data, "next": JOBS}, follow=True)
    assert response.status_code == 200
    assert any("is not a database BackWave's backends use (default, other)" in text for text in texts(response))
    assert operator_client.session[SESSION_KEY] == "other"  # the choice stays as it was


def test_an_unsafe_next_goes_to_the_admin_index(operator_client):
    response = operator_client.post(switch(), {"database": "other", "next": "https://elsewhere.example/"})
    assert response["Location"] == reverse("admin:index")


def test_a_selection_no_longer_in_the_settings_falls_back_to_the_first_database(operator_client):
    local = local_job()
    select(operator_client, "gone")
    response = operator_client.get(JOBS)
    assert response.status_code == 200
    assert [job.pk for job in response.context["cl"].result_list] == [local.pk]
    assert any("'gone' is not a database BackWave's backends use" in text and "default" in text for text in texts(response))
    assert SESSION_KEY not in operator_client.session


def test_one_database_shows_no_switch(operator_client, settings):
    settings.TASKS = {"default": settings.TASKS["default"]}
    assert 'id="bw-database-switch"' not in operator_client.get(JOBS).content.decode()


def test_permissions_are_the_same_on_every_database(readonly_client):
    remote = failed(remote_job())
    response = readonly_client.post(switch(), {"database": "other", "next": JOBS})
    assert response.status_code == 302
    assert [job.pk for job in readonly_client.get(JOBS).context["cl"].result_list] == [remote.pk]
    assert readonly_client.post(JOBS, {"action": "retry_now", "_selected_action": [remote.pk]}).status_code == 403
    assert readonly_client.post(QUEUES, {"action": "pause", "_selected_action": ["remote"]}).status_code == 403
    assert Job.objects.using("other").get(pk=remote.pk).state == "failed"


def test_the_switch_needs_a_staff_login(client):
    response = client.post(switch(), {"database": "other", "next": JOBS})
    assert response.status_code == 302 and "/login/" in response["Location"]

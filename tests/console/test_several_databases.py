"""The commands with two databases (the test settings' "default" and "other", where the "remote"
backend enqueues): ``backwave_jobs`` covers both unless ``--database`` narrows it, and says where
each row lives; ``backwave_queue`` writes a queue's row where that queue's jobs live."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from backwave.models import Job, Queue
from tests.factories import JobFactory
from tests.shell.worker_tasks import noop

pytestmark = pytest.mark.django_db(databases=["default", "other"])


def local_job(n: int = 1) -> Job:
    return Job.objects.get(pk=int(noop.enqueue(n).id))


def remote_job(n: int = 2) -> Job:
    return Job.objects.using("other").get(pk=int(noop.using(backend="remote", queue_name="remote").enqueue(n).id))


def failed(job: Job) -> Job:
    Job.objects.using(job._state.db).filter(pk=job.pk).update(state="failed", finished_at=Now(), attempts=1)
    return job


def run(command: str, *args) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_jobs_list_covers_every_backend_database_and_names_each_rows_database():
    local, remote = local_job(), remote_job()
    rows = json.loads(run("backwave_jobs", "list", "--json"))
    assert sorted((row["database"], row["id"], row["queue"]) for row in rows) == [
        ("default", local.pk, "e2e"),
        ("other", remote.pk, "remote"),
    ]
    table = run("backwave_jobs", "list").splitlines()
    assert table[0].split()[:2] == ["ID", "DATABASE"]
    assert sorted(line.split()[1] for line in table[1:]) == ["default", "other"]
    rows = json.loads(run("backwave_jobs", "list", "--json", "--database", "other"))
    assert [(row["database"], row["id"]) for row in rows] == [("other", remote.pk)]


def test_jobs_list_pages_across_the_databases():
    for n in range(3):
        local_job(n)
        remote_job(n)
    first = json.loads(run("backwave_jobs", "list", "--json", "--limit", "4"))
    rest = json.loads(run("backwave_jobs", "list", "--json", "--limit", "4", "--offset", "4"))
    assert len(first) == 4 and len(rest) == 2
    shown = [(row["database"], row["id"]) for row in first + rest]
    assert len(set(shown)) == 6


def test_a_database_backwave_does_not_use_is_refused():
    with pytest.raises(CommandError, match=r"--database 'nope' is not a database BackWave's backends use \(default, other\)"):
        run("backwave_jobs", "list", "--database", "nope")
    with pytest.raises(CommandError, match=r"--database 'nope' is not a database BackWave's backends use"):
        run("backwave_queue", "pause", "remote", "--database", "nope")


def test_jobs_retry_acts_on_every_database_or_the_one_named():
    local, remote = failed(local_job()), failed(remote_job())
    run("backwave_jobs", "retry", "--state", "failed", "--yes", "--database", "other")
    assert Job.objects.using("other").get(pk=remote.pk).state == "ready"
    assert Job.objects.get(pk=local.pk).state == "failed"
    failed(remote)
    out = run("backwave_jobs", "retry", "--state", "failed", "--yes")
    assert Job.objects.using("other").get(pk=remote.pk).state == "ready"
    assert Job.objects.get(pk=local.pk).state == "ready"
    assert "Retried 2 jobs (default: 1, other: 1)." in out


def test_jobs_show_finds_the_job_in_its_database_and_asks_when_the_id_is_in_both():
    remote = remote_job(8)
    Job.objects.filter(pk=remote.pk).delete()  # that id in "other" only
    assert json.loads(run("backwave_jobs", "show", str(remote.pk), "--json"))["database"] == "other"
    JobFactory(id=remote.pk)  # the same id in "default": another job
    with pytest.raises(CommandError, match=rf"Job {remote.pk} exists in databases default and other: name one with --database"):
        run("backwave_jobs", "show", str(remote.pk))
    document = json.loads(run("backwave_jobs", "show", str(remote.pk), "--json", "--database", "other"))
    assert (document["database"], document["payload"]["args"]) == ("other", [8])
    with pytest.raises(CommandError, match=r"No job 999999999 in databases default and other\."):
        run("backwave_jobs", "show", "999999999")


def test_queue_pause_writes_the_row_where_the_queues_jobs_live():
    run("backwave_queue", "pause", "remote")
    assert Queue.objects.using("other").get(name="remote").paused
    assert not Queue.objects.filter(name="remote").exists()
    run("backwave_queue", "limit", "remote", "2")
    assert Queue.objects.using("other").get(name="remote").concurrency_limit == 2
    run("backwave_queue", "pause", "e2e")
    assert Queue.objects.get(name="e2e").paused and not Queue.objects.using("other").filter(name="e2e").exists()


def test_a_queue_that_lives_in_two_databases_needs_database(settings):
    # A backend with no QUEUES accepts every queue: "e2e" now lives in both databases.
    settings.TASKS = {**settings.TASKS, "remote": {**settings.TASKS["remote"], "QUEUES": []}}
    with pytest.raises(CommandError, match=r"Queue 'e2e' lives in databases default and other: name one with --database"):
        run("backwave_queue", "pause", "e2e")
    assert not Queue.objects.filter(name="e2e").exists() and not Queue.objects.using("other").filter(name="e2e").exists()
    run("backwave_queue", "pause", "e2e", "--database", "other")
    assert Queue.objects.using("other").get(name="e2e").paused and not Queue.objects.filter(name="e2e").exists()


def test_queue_list_shows_each_database_when_there_are_several():
    remote_job()
    rows = json.loads(run("backwave_queue", "list", "--json"))
    remote = [row for row in rows if row["queue"] == "remote"]
    assert [(row["database"], row["ready"]) for row in remote] == [("other", 1)]
    assert run("backwave_queue", "list").splitlines()[0].split()[:2] == ["DATABASE", "QUEUE"]
    assert {row["database"] for row in json.loads(run("backwave_queue", "list", "--json", "--database", "other"))} == {"other"}

"""manage.py backwave_jobs in a subprocess, against the test database: list, show, retry, cancel,
purge, their filters, --json, the permission checks of --as-user and the admin's history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import connection, connections
from django.db.models import F
from django.utils import timezone

from backwave.models import Attempt, Job
from tests.admin.conftest import make_attempt, make_job, staff_user

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def run(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "BACKWAVE_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
        "BACKWAVE_TEST_OTHER_DATABASE_NAME": connections["other"].settings_dict["NAME"],
    }
    return subprocess.run(
        [sys.executable, "manage.py", "backwave_jobs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


@pytest.fixture
def jobs():
    failed = make_job(
        state="failed",
        queue="emails",
        task_path="shop.tasks.send",
        attempts=1,
        tags=["vip"],
        payload={"args": [], "kwargs": {"customer_id": 42, "api_key": "sk-live-9"}},
    )
    make_attempt(
        failed,
        1,
        "failed",
        error_class="shop.errors.Bounce",
        traceback='Traceback (most recent call last):\n  File "/app/shop/tasks.py", line 3, in send\n    raise Bounce()\nshop.errors.Bounce: mailbox full\n',
    )
    old_failed = make_job(state="failed", queue="emails", task_path="shop.tasks.send")
    Job.objects.filter(pk=old_failed.pk).update(finished_at=F("finished_at") - timedelta(days=2))
    ready = make_job(queue="reports", task_path="shop.tasks.report")
    done = make_job(
        state="succeeded", queue="reports", task_path="shop.tasks.report", return_value={"token": "t-secret", "rows": 3}
    )
    Job.objects.filter(pk=done.pk).update(finished_at=timezone.now() - timedelta(days=8))
    return {"failed": failed, "old_failed": old_failed, "ready": ready, "done": done}


def test_list_filters_and_json(jobs):
    listing = run("list", "--queue", "emails", "--state", "failed", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert [row["id"] for row in rows] == [jobs["old_failed"].pk, jobs["failed"].pk]
    assert rows[1]["last_error"] == "Bounce: mailbox full"
    assert rows[1]["tags"] == ["vip"]

    older = json.loads(run("list", "--state", "failed", "--older-than", "1d", "--json").stdout)
    assert [row["id"] for row in older] == [jobs["old_failed"].pk]
    searched = json.loads(run("list", "--search", "customer_id=42 tag:vip", "--json").stdout)
    assert [row["id"] for row in searched] == [jobs["failed"].pk]

    table = run("list", "--task", "shop.tasks.report")
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "DATABASE",
        "STATE",
        "QUEUE",
        "TASK",
        "ATTEMPTS",
        "ENQUEUED",
        "FINISHED",
        "WORKER",
        "LAST_ERROR",
    ]
    assert [line.split()[0] for line in lines[1:]] == [str(jobs["done"].pk), str(jobs["ready"].pk)]
    assert "UTC" in lines[1]  # times name their zone


def test_show_hides_secrets(jobs):
    shown = run("show", str(jobs["failed"].pk), "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["payload"] == {"args": [], "kwargs": {"customer_id": 42, "api_key": "********************"}}
    assert document["attempts_log"][0]["error_message"] == "mailbox full"
    text = run("show", str(jobs["done"].pk)).stdout
    assert "t-secret" not in text and '"rows": 3' in text
    missing = run("show", "999999999")
    assert missing.returncode == 1 and "No job 999999999" in missing.stderr


def test_retry_cancel_and_purge(jobs):
    assert "add filters, or --all" in run("retry").stderr
    not_confirmed = run("retry", "--state", "failed", stdin="")
    assert not_confirmed.returncode == 1 and "This would retry 2 failed, quarantined or held jobs" in not_confirmed.stderr
    assert Job.objects.filter(state="failed").count() == 2

    dry = json.loads(run("retry", "--queue", "emails", "--dry-run", "--json").stdout)
    assert (dry["matching"], dry["changed"]) == (2, 0)

    retried = run("retry", "--queue", "emails", "--older-than", "1d", "--yes")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == "Retried 1 job (default: 1)."  # two databases: it says which
    assert Job.objects.get(pk=jobs["old_failed"].pk).state == "ready"
    assert Job.objects.get(pk=jobs["failed"].pk).state == "failed"

    cancelled = json.loads(run("cancel", "--id", str(jobs["ready"].pk), "--id", str(jobs["failed"].pk), "--yes", "--json").stdout)
    assert (cancelled["changed"], cancelled["ids"]) == (1, [jobs["ready"].pk])

    purged = run("purge", "--state", "succeeded", "--older-than", "7d", "--yes")
    assert purged.stdout.strip() == "Purged 1 job (default: 1)."
    assert not Job.objects.filter(pk=jobs["done"].pk).exists()
    assert not Attempt.objects.filter(job_id=jobs["done"].pk).exists()
    assert LogEntry.objects.count() == 0  # no --as-user: nobody to name in the admin's history


def test_as_user_applies_the_admins_permissions_and_records_history(jobs):
    viewer = staff_user("viewer", ["view_job"])
    staff_user("retrier", ["view_job", "retry_job"])
    from django.contrib.auth.models import User

    User.objects.create_user("outsider", password="pw")  # not staff

    assert run("list", "--as-user", "viewer", "--json").returncode == 0
    refused = run("retry", "--state", "failed", "--yes", "--as-user", "viewer")
    assert refused.returncode == 1 and "lacks the permission 'backwave.retry_job'" in refused.stderr
    assert "only active staff" in run("list", "--as-user", "outsider").stderr
    assert "no such user" in run("list", "--as-user", "nobody").stderr
    assert "'backwave.delete_job'" in run("purge", "--state", "succeeded", "--yes", "--as-user", "retrier").stderr
    assert Job.objects.filter(state="failed").count() == 2

    done = run("retry", "--queue", "emails", "--yes", "--as-user", "retrier")
    assert done.stdout.strip() == "Retried 2 jobs (default: 2).", done.stderr
    entries = list(LogEntry.objects.all())
    assert sorted((e.user.username, e.action_flag, int(e.object_id)) for e in entries) == sorted(
        [("retrier", CHANGE, jobs["failed"].pk), ("retrier", CHANGE, jobs["old_failed"].pk)]
    )
    assert all("by manage.py backwave_jobs retry (queue in ['emails'])" in e.change_message for e in entries)
    assert viewer.pk not in {e.user_id for e in entries}

    staff_user("purger", ["view_job", "delete_job"])
    run("purge", "--id", str(jobs["done"].pk), "--yes", "--as-user", "purger")
    assert LogEntry.objects.filter(action_flag=DELETION, object_id=str(jobs["done"].pk), user__username="purger").exists()


def test_bad_filters_are_clear_errors(jobs):
    assert "give a number and a unit" in run("list", "--older-than", "soon").stderr
    assert "invalid choice: 'done'" in run("list", "--state", "done").stderr
    assert "--search: 'password' is redacted" in run("list", "--search", "password=x").stderr

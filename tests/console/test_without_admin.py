"""A project without ``django.contrib.admin`` (tests/settings_noadmin.py): every entry point an
operator or code uses, each in a real subprocess against databases it migrated itself.

The admin pages are an optional part of BackWave: the operator actions, history, statistics,
search and formatters they draw live in ``backwave.ops``, which never imports the admin, and
admin history is recorded only where the admin is installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "noadmin-metrics-token-for-tests-only"  # tests/settings_noadmin.py's METRICS_TOKEN


@pytest.fixture(scope="module")
def fresh_databases(django_db_setup, django_db_blocker):
    """Two empty databases (default and other), created here so that ``migrate`` really runs."""
    base = connection.settings_dict["NAME"]
    names = {"default": f"{base}_noadmin", "other": f"{base}_noadmin_other"}
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for name in names.values():
            cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield names
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for name in names.values():
            cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def environment(names: dict) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_noadmin",
        "BACKWAVE_TEST_DATABASE_NAME": names["default"],
        "BACKWAVE_TEST_OTHER_DATABASE_NAME": names["other"],
        "PYTHONUNBUFFERED": "1",
    }


def manage(names: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environment(names), capture_output=True, text=True, timeout=120
    )


def python(names: dict, code: str) -> subprocess.CompletedProcess:
    """``code`` run by ``manage.py shell``: with Django set up, as a user's script would be."""
    return manage(names, "shell", "--no-imports", "-c", code)


@pytest.fixture(scope="module")
def migrated(fresh_databases):
    runs = [
        manage(fresh_databases, "migrate", "--no-input"),
        manage(fresh_databases, "migrate", "--no-input", "--database", "other"),
    ]
    return fresh_databases, runs


@pytest.fixture
def names(migrated):
    names, runs = migrated
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    return names


def enqueue(names: dict, count: int = 1) -> list[int]:
    code = f"from tests.shell.worker_tasks import noop\nprint(' '.join(noop.enqueue(n).id for n in range({count})))\n"
    run = python(names, code)
    assert run.returncode == 0, run.stderr[-3000:]
    return [int(text) for text in run.stdout.split()]


def listed(names: dict) -> dict[int, str]:
    run = manage(names, "backwave_jobs", "list", "--json", "--limit", "1000")
    assert run.returncode == 0, run.stderr[-3000:]
    return {row["id"]: row["state"] for row in json.loads(run.stdout)}


def test_migrate_without_the_admin(migrated):
    _names, runs = migrated
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert "Applying backwave.0001" in runs[0].stdout
    assert "Applying admin." not in runs[0].stdout


def test_backwave_jobs_lists_and_cancels_without_the_admin(names):
    first, second = enqueue(names, 2)
    assert listed(names) == {first: "ready", second: "ready"}
    run = manage(names, "backwave_jobs", "cancel", "--id", str(first), "--yes")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Cancelled 1 job" in run.stdout
    assert listed(names) == {first: "cancelled", second: "ready"}
    # --as-user applies the admin's permissions; with no admin there is no history to record into.
    made = python(
        names,
        "from django.contrib.auth.models import Permission, User\n"
        "user = User.objects.create_user('op', is_staff=True)\n"
        "user.user_permissions.add(*Permission.objects.filter(codename__in=['view_job', 'cancel_job']))\n",
    )
    assert made.returncode == 0, made.stderr[-3000:]
    run = manage(names, "backwave_jobs", "cancel", "--id", str(second), "--yes", "--as-user", "op")
    assert run.returncode == 0, run.stderr[-3000:]
    assert listed(names) == {first: "cancelled", second: "cancelled"}


def test_backwave_cancel_and_the_facade_without_the_admin(names):
    by_command, by_code = enqueue(names, 2)
    run = manage(names, "backwave_cancel", str(by_command))
    assert run.returncode == 0, run.stderr[-3000:]
    run = python(names, f"import backwave\nprint(backwave.cancel('{by_code}'))\n")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["cancelled"]
    states = listed(names)
    assert (states[by_command], states[by_code]) == ("cancelled", "cancelled")


def test_backwave_queue_without_the_admin(names):
    for args in (("pause", "e2e"), ("limit", "e2e", "3"), ("resume", "e2e")):
        run = manage(names, "backwave_queue", *args)
        assert run.returncode == 0, run.stderr[-3000:]
    run = manage(names, "backwave_queue", "list")
    assert run.returncode == 0, run.stderr[-3000:]
    assert ["default", "e2e", "active", "3"] in [line.split()[:4] for line in run.stdout.splitlines()]


def test_the_metrics_view_without_the_admin(names):
    enqueue(names)
    code = (
        "from django.test import Client\nfrom django.test.utils import setup_test_environment\n"
        "setup_test_environment()\n"
        f"response = Client().get('/backwave/metrics', headers={{'Authorization': 'Bearer {TOKEN}'}})\n"
        "print(response.status_code)\nprint(response.content.decode())\n"
    )
    run = python(names, code)
    assert run.returncode == 0, run.stderr[-3000:]
    status, _, body = run.stdout.partition("\n")
    assert status == "200", body
    assert 'backwave_jobs{database="default",queue="e2e",state="ready"}' in body


def test_a_worker_runs_a_job_and_reports_health_without_the_admin(names):
    (job,) = enqueue(names)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "backwave_worker", "--queues", "e2e", "--no-hints"],
        cwd=ROOT,
        env=environment(names),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while listed(names).get(job) != "succeeded" and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker.poll() is None, worker.communicate()[0][-3000:]
        assert listed(names)[job] == "succeeded"
        health = manage(names, "backwave_health")
        assert health.returncode == 0, health.stdout + health.stderr[-3000:]
        assert "healthy" in health.stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
    assert worker.returncode == 0, output[-3000:]

"""A backend whose OPTIONS DATABASE is another database: real workers serve that database too.

The test settings have a second database (alias "other") and a backend "remote" whose queue
"remote" lives there; each test gets test databases for both aliases.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from backwave.models import Job, Lease, Pump, Queue, Schedule
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

BOTH = ["default", "other"]
pytestmark = pytest.mark.slow

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.5", "--log-every", "0.5")


def _listeners(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'backwave-hints' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def _hints_received(output: str) -> dict[str, int]:
    """The per-database hint counts of the worker's closing line."""
    (line,) = re.findall(r"wake-up hints received: (.*)", output)
    return {alias: int(count) for alias, count in re.findall(r"(\S+) (\d+)", line)}


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_jobs_of_a_backend_on_another_database_run_woken_by_that_databases_hints(start_worker):
    # Poll every 60 s: only a wake-up hint from the other database can start its jobs in time.
    worker = start_worker("--queues", "e2e,remote", "--poll-interval", "60", "--log-every", "60")
    worker.wait_for(lambda: _listeners("default") == 1 and _listeners("other") == 1, what="a hint listener on each database")
    worker.wait_for(
        lambda: Lease.objects.count() == 1 and Lease.objects.using("other").count() == 1, what="a pump on each database"
    )
    time.sleep(0.3)  # let the pumps' first (empty) claims finish: the jobs must come from the hint
    results = enqueue_many([(worker_tasks.remote_echo, (i,), {}) for i in range(5)])
    assert Job.objects.using("other").count() == 5 and Job.objects.count() == 0

    worker.wait_for(
        lambda: Job.objects.using("other").filter(state="succeeded").count() == 5, timeout=20, what="the remote jobs running"
    )
    assert [worker_tasks.remote_echo.get_result(r.id).return_value for r in results] == [{"n": i} for i in range(5)]
    # The pump of the other database keeps its health row there.
    assert set(Pump.objects.using("other").values_list("group", flat=True)) == {"cli"}
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert Lease.objects.using("other").count() == 0
    hints = _hints_received(worker.output)
    assert hints["other"] >= 1 and hints["default"] == 0, worker.output


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_configured_groups_write_schedules_and_queue_settings_to_their_database(start_worker):
    groups = [{"name": "local", "queues": ["e2e"]}, {"name": "remote", "queues": ["remote"]}]
    schedules = {
        "remote-tick": {"task": worker_tasks.remote_echo.module_path, "cron": "* * * * * *", "kwargs": {"n": 7}},
        "local-tick": {"task": worker_tasks.noop.module_path, "cron": "0 3 * * *"},
    }
    queues = {"remote": {"concurrency_limit": 3}, "e2e": {"concurrency_limit": 5}}
    env = {"BACKWAVE_TEST_FAULTS": json.dumps({"worker_groups": groups, "schedules": schedules, "queues": queues})}
    worker = start_worker(*FAST, env=env)
    # Maintenance on the other database mints the remote schedule's slots, and its pump runs them.
    worker.wait_for(
        lambda: Job.objects.using("other").filter(state="succeeded", return_value={"n": 7}).exists(),
        what="a minted remote job running",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert list(Schedule.objects.using("other").values_list("name", flat=True)) == ["remote-tick"]
    assert list(Schedule.objects.values_list("name", flat=True)) == ["local-tick"]
    assert dict(Queue.objects.using("other").values_list("name", "concurrency_limit")) == {"remote": 3}
    assert dict(Queue.objects.values_list("name", "concurrency_limit")) == {"e2e": 5}
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_the_database_flag_and_a_groups_database_setting_choose_the_database(start_worker):
    results = enqueue_many([(worker_tasks.remote_echo, (i,), {}) for i in range(3)])
    # An explicit database wins over the queues' own: these pumps claim "remote" on "other" only.
    worker = start_worker("--queues", "remote", "--database", "other", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output
    assert {Job.objects.using("other").get(id=r.id).state for r in results} == {"succeeded"}

    groups = [{"name": "pinned", "queues": ["e2e"], "database": "other"}]
    Job.objects.using("other").create(task_path=worker_tasks.noop.module_path, queue="e2e", payload={"args": [1], "kwargs": {}})
    worker = start_worker("--until-idle", *FAST, env={"BACKWAVE_TEST_FAULTS": json.dumps({"worker_groups": groups})})
    assert worker.wait() == 0, worker.output
    assert list(Job.objects.using("other").filter(queue="e2e").values_list("state", flat=True)) == ["succeeded"]


def test_a_misspelt_database_is_a_clear_error_at_start(settings):
    with pytest.raises(CommandError, match=r"--database 'othre' is not in DATABASES \(default, other\)\. Did you mean 'other'\?"):
        call_command("backwave_worker", "--queues", "remote", "--database", "othre")
    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "pinned", "queues": ["e2e"], "database": "othre"}]}
    with pytest.raises(
        CommandError,
        match=r"Worker Group 'pinned': database 'othre' is not in DATABASES \(default, other\)\. Did you mean 'other'\?",
    ):
        call_command("backwave_worker")


def test_a_group_spanning_two_databases_runs_its_pumps_on_each_with_the_queues_that_live_there():
    from backwave.core.policy import Strict, Weighted
    from backwave.databases import place_groups
    from backwave.conf import group_from_mapping

    spanning = group_from_mapping({"name": "both", "queues": ["e2e", "remote", "default"], "pumps": 2})
    weighted = group_from_mapping({"name": "shared", "policy": Weighted({"remote": 1, "e2e": 3})})
    unknown = group_from_mapping({"name": "nobody", "queues": ["declared-nowhere"]})
    placed = place_groups([spanning, weighted, unknown])
    assert [(g.name, g.database, g.policy, g.pumps) for g in placed] == [
        ("both", "default", Strict("e2e", "default"), 2),
        ("both", "other", Strict("remote"), 2),
        ("shared", "other", Weighted({"remote": 1}), 1),
        ("shared", "default", Weighted({"e2e": 3}), 1),
        ("nobody", "default", Strict("declared-nowhere"), 1),  # where workers always looked
    ]
    # An explicit database keeps every queue of the group, there only.
    assert [(g.database, g.policy) for g in place_groups([spanning], database="other")] == [("other", spanning.policy)]


def test_a_groups_database_must_be_an_alias():
    from backwave.core.options import WorkerGroupConfigError
    from backwave.conf import group_from_mapping

    with pytest.raises(
        WorkerGroupConfigError, match=r"Worker Group 'g': database must be a DATABASES alias \(a string\) or None, got 5"
    ):
        group_from_mapping({"name": "g", "database": 5})
    assert group_from_mapping({"name": "g", "database": "other"}).database == "other"

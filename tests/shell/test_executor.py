"""The executor: the one interpreter of the driver's store commands, shared by every pump."""

from __future__ import annotations

import ast
import subprocess
import sys
import uuid
from datetime import UTC
from pathlib import Path

import pytest
from django.db import connection

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.shell import executor as executor_module
from backwave.shell.executor import Executor
from backwave.store.postgres import PostgresStore
from tests.factories import JobFactory

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = WorkerGroupOptions(name="g", policy=Strict("default"), pool_size=1)


def test_the_executor_loads_without_django():
    code = "import sys, backwave.shell.executor; print(sorted({m.split('.')[0] for m in sys.modules} & {'django'}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    assert loaded == "[]"


def test_the_executor_starts_no_thread_and_reads_no_clock_or_randomness_of_its_own():
    tree = ast.parse(Path(executor_module.__file__).read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    nodes = [node for node in ast.walk(tree) if id(node) not in typing_only]
    imported = {alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in nodes if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    called = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in nodes
        if isinstance(node, ast.Call)
    }
    assert not imported & {"threading", "time", "random", "secrets", "asyncio", "queue", "socket", "os"}
    assert not called & {"now", "monotonic", "perf_counter", "time", "uuid1", "uuid4", "urandom", "Thread", "sleep"}


@pytest.mark.django_db(transaction=True)
def test_lease_expiry_releases_as_many_jobs_as_the_command_says():
    store = PostgresStore.from_django()
    executor = Executor(
        store,
        options=OPTIONS,
        worker_id="test:1:g:0",
        hostname="test",
        pid=1,
        clock=lambda: 0.0,
        jitter=lambda: 0.0,
        time_zone=lambda: UTC,
        new_lease_id=uuid.uuid4,
    )
    try:
        JobFactory.create_batch(3)
        for n in range(3):
            lease_id = uuid.uuid4()
            store.open_lease(lease_id=lease_id, worker_id=f"test:1:g:{n}", group="g", hostname="test", pid=1, duration=60.0)
            assert len(store.claim_jobs(lease_id=lease_id, worker_id=f"test:1:g:{n}", queues=("default",), limit=1)) == 1
        with connection.cursor() as cursor:
            cursor.execute("UPDATE backwave_lease SET expires_at = statement_timestamp() - interval '1 second'")

        assert executor.run((cmd.ExpireLeases(limit=2),)) == [ev.LeasesExpired(now=0.0, released=2)]
        assert executor.run((cmd.ExpireLeases(limit=2),)) == [ev.LeasesExpired(now=0.0, released=1)]
    finally:
        store.close()

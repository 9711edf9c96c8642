"""A pump no store call has answered for longer than its lease is unhealthy, whatever the reason.

However a fault is classified, a pump that gets nothing done through the store for a whole lease
does no work and holds none: the health endpoint answers 503 with the last error, the pump's row
goes stale (``manage.py backwave_health`` exits 1, the admin flags it, with the reason), and all
of it is healthy again once the store answers. One in-process worker on the real PostgreSQL; its
store is a real PostgresStore behind a switch that makes every engine call fail the way a lock
or statement timeout does (the health rows still get through, as they would then).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.tasking.registry import TaskRegistry
from backwave.shell.worker import Worker
from backwave.store.contract import TransientStoreError
from backwave.store.postgres import PostgresStore
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_TIMEOUT = "canceling statement due to lock timeout"


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def backwave_health() -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("backwave_health", stdout=out)
    except CommandError as error:
        return error.returncode, f"{out.getvalue()}\n{error}"
    return 0, out.getvalue()


class Switchable:
    """A real PostgresStore; while ``failing`` is set every engine call fails transiently."""

    _HEALTH = frozenset({"record_pumps_many", "forget_pumps_many", "close"})

    def __init__(self, failing: threading.Event):
        self.inner = PostgresStore.from_django()
        self.failing = failing

    def __getattr__(self, name):
        attribute = getattr(self.inner, name)
        if not callable(attribute) or name in self._HEALTH:
            return attribute

        def call(*args, **kwargs):
            if self.failing.is_set():
                raise TransientStoreError(f"{name} failed [55P03]: {LOCK_TIMEOUT}")
            return attribute(*args, **kwargs)

        return call


def test_a_pump_whose_store_calls_all_fail_for_a_lease_is_unhealthy_until_it_recovers(admin_client):
    failing = threading.Event()
    group = WorkerGroupOptions(
        name="stall",
        policy=Strict("e2e"),
        pool_size=2,
        poll_interval=0.05,
        lease_duration=1.0,
        maintenance_interval=3600,
        database="default",
    )
    worker = Worker(
        [group], store_factory=lambda alias: Switchable(failing), registry=TaskRegistry([worker_tasks.noop]), health_port=0
    )
    url = f"http://127.0.0.1:{worker.health_server.port}/"
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, name="worker-main")
    thread.start()
    try:
        wait_until(lambda: get(url)[0] == 200 and backwave_health()[0] == 0, "a healthy start")

        failing.set()
        wait_until(lambda: get(url)[0] == 503, "the endpoint answering 503")
        code, body = get(url)
        assert body["status"] == "unhealthy" and body["groups"] == {"stall": "degraded"}
        (pump,) = body["pumps"]
        assert pump["status"] == "degraded" and pump["stalled"] is True and pump["alive"]
        assert pump["seconds_since_store_call"] > group.lease_duration
        assert LOCK_TIMEOUT in pump["reason"]
        # Its row stopped being refreshed when its heartbeats stopped landing: stale, with the error.
        # Its lease lapses first (backwave_health exits 1: lost), then its row goes stale.
        wait_until(
            lambda: (lambda code, out: code == 1 and "(stale)" in out)(*backwave_health()), "backwave_health exiting 1, stale"
        )
        code, out = backwave_health()
        assert "degraded (stale)" in out and LOCK_TIMEOUT in out, out
        assert "lost: degraded (stale)" in out and "is lost: it holds no live lease" in out, out
        page = admin_client.get(reverse("admin:backwave_pump_changelist")).content.decode()
        assert "stale" in page and LOCK_TIMEOUT in page

        failing.clear()
        wait_until(lambda: get(url)[0] == 200, "the endpoint answering 200 again")
        code, body = get(url)
        assert body["status"] == "healthy" and body["pumps"][0]["stalled"] is False and body["pumps"][0]["reason"] == ""
        wait_until(lambda: backwave_health()[0] == 0, "backwave_health exiting 0 again")
        job = worker_tasks.noop.enqueue(5)
        wait_until(lambda: Job.objects.get(id=job.id).state == "succeeded", "work done after the recovery")
    finally:
        failing.clear()
        worker.drain(timeout=5)
        thread.join(30)
    assert not thread.is_alive()

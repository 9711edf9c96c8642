"""A worker whose every pump halts at once (a database it can never connect to) stays up answering
503 until it is signalled, however early the pumps halt: before its watch loop even began."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request

import pytest
from django.db import connection

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.shell.hints import HintListener
from backwave.tasking.registry import TaskRegistry
from backwave.shell.worker import Worker
from backwave.store.contract import StoreError
from backwave.store.postgres import django_conninfo

pytestmark = pytest.mark.django_db(transaction=True)


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class StartsAfterThePumpsHalted(HintListener):
    """Worker.run starts the listener after the pumps: this one waits until they have all halted
    (as a slow start would), so the watch loop begins with every pump already gone."""

    pumps: list = []

    def start(self):
        for pump in self.pumps:
            assert pump.join(30)
        super().start()


def refuses(alias):
    raise StoreError(f'cannot connect to PostgreSQL [3D000]: FATAL:  database "{alias}_gone" does not exist')


def test_a_worker_whose_pumps_halted_before_it_watched_them_stays_up_until_signalled():
    group = WorkerGroupOptions(name="gone", policy=Strict("e2e"), pumps=2, database="default")
    listener = StartsAfterThePumpsHalted(django_conninfo(connection.settings_dict))
    worker = Worker([group], store_factory=refuses, registry=TaskRegistry(), hints={"default": listener}, health_port=0)
    listener.pumps = worker.pumps
    codes = []
    thread = threading.Thread(target=lambda: codes.append(worker.run(install_signal_handlers=False)), name="worker-main")
    thread.start()
    try:
        assert listener.connected.wait(30), "the listener never started"
        assert thread.is_alive(), f"the worker returned {codes} instead of staying up"
        code, body = get(f"http://127.0.0.1:{worker.health_server.port}/")
        assert code == 503 and body["status"] == "halted"
        assert all('database "default_gone" does not exist' in p["reason"] for p in body["pumps"])
    finally:
        worker._on_signal(signal.SIGTERM, None)  # what SIGTERM does
        thread.join(30)
    assert codes == [1]

"""The threads around a pump: the wake-up hint listener, and who may touch a pump's driver.

Only the pump's own thread reads or writes its Node Driver. The listener posts a hint (at most
one waits in the pump's channel at a time) and other threads read the snapshot the pump thread
publishes after each event. The listener itself survives whatever a subscriber or its own code
raises, and its liveness is part of the worker's health. All against the real PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import psycopg
import pytest
from django.db import connection

from backwave.core.driver import NodeDriver
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.shell import pump as pump_module
from backwave.shell.hints import CHANNEL, HintListener
from backwave.shell.pump import Pump
from backwave.tasking.registry import TaskRegistry
from backwave.shell.worker import Worker
from backwave.store.postgres import PostgresStore, django_conninfo
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def notify(queue: str) -> None:
    """What a committed enqueue sends."""
    with psycopg.connect(**django_conninfo(connection.settings_dict), autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", [CHANNEL, queue])


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def listener():
    made = []

    def make(**connect_overrides) -> HintListener:
        made.append(
            HintListener({**django_conninfo(connection.settings_dict), **connect_overrides}, max_backoff=0.2, wait_step=0.05)
        )
        return made[-1]

    yield make
    for each in made:
        each.stop()


# ---- the listener survives ------------------------------------------------------------------------


def test_a_subscriber_that_raises_does_not_kill_the_listener(listener, caplog):
    delivered = []

    def broken():
        raise RuntimeError("a subscriber with a bug")

    hints = listener()
    hints.subscribe(["q"], broken)
    hints.subscribe(["q"], lambda: delivered.append("q"))
    hints.start()
    wait_until(hints.connected.is_set, "the listener connecting")
    with caplog.at_level(logging.ERROR, logger="backwave.hints"):
        notify("q")
        wait_until(lambda: len(delivered) == 1, "the hint reaching the subscriber after the broken one")
        notify("q")
        wait_until(lambda: len(delivered) == 2, "a later hint still delivered")
    assert delivered == ["q", "q"]
    assert hints.alive and hints.connected.is_set()
    failures = [r for r in caplog.records if "subscriber failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info and "a subscriber with a bug" in str(r.exc_info[1]) for r in failures)


class FailsOnce(HintListener):
    """A listener whose first session ends in an error that is not psycopg's (a bug of its own)."""

    sessions = 0

    def _listen(self):
        self.sessions += 1
        if self.sessions == 1:
            raise RuntimeError("not a psycopg error")
        super()._listen()


def test_an_error_of_the_listeners_own_reconnects_instead_of_ending_it(caplog):
    delivered = []
    hints = FailsOnce(django_conninfo(connection.settings_dict), max_backoff=0.2, wait_step=0.05)
    hints.subscribe(["q"], lambda: delivered.append("q"))
    try:
        with caplog.at_level(logging.ERROR, logger="backwave.hints"):
            hints.start()
            wait_until(hints.connected.is_set, "the listener reconnecting after its own error")
        assert hints.sessions == 2
        assert "RuntimeError: not a psycopg error" in hints.health()["last_error"]
        assert any(r.exc_info for r in caplog.records if "hint listener failed" in r.getMessage()), "logged with its traceback"
        notify("q")
        wait_until(lambda: delivered == ["q"], "a hint delivered after the reconnect")
    finally:
        hints.stop()


# ---- the listener in the worker's health --------------------------------------------------------


@pytest.fixture
def running_worker():
    """running_worker(hints) -> the Worker, run on a thread with a health endpoint; drained after."""
    started = []

    def start(hints: HintListener) -> Worker:
        group = WorkerGroupOptions(
            name="health", policy=Strict("e2e"), pool_size=2, poll_interval=0.05, maintenance_interval=3600, database="default"
        )
        worker = Worker(
            [group],
            store_factory=PostgresStore.from_django,
            registry=TaskRegistry([worker_tasks.noop]),
            hints={"default": hints},
            health_port=0,
        )
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, name="worker-main")
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.drain(timeout=5)
        thread.join(30)


def test_a_listener_that_cannot_connect_is_degraded_not_a_503(listener, running_worker):
    hints = listener(host="127.0.0.1", port=1)  # nothing listens there: refused, retried with backoff
    worker = running_worker(hints)
    wait_until(lambda: hints.health()["last_error"], "the listener failing to connect")
    code, body = get(f"http://127.0.0.1:{worker.health_server.port}/")
    assert code == 200, body
    assert body["status"] == "degraded"
    hints = body["hints"]["default"]
    assert hints["status"] == "reconnecting" and hints["alive"] and not hints["connected"]
    assert "Connection refused" in hints["last_error"]


class ListenerKilled(BaseException):
    """Stands for whatever no handler catches (a BaseException): the listener's thread ends."""


class Dies(HintListener):
    def _listen(self):
        raise ListenerKilled("the listener thread ends here")


def test_the_health_endpoint_reports_a_dead_listener_as_unhealthy(running_worker):
    hints = Dies(django_conninfo(connection.settings_dict))
    worker = running_worker(hints)
    wait_until(lambda: hints._thread.ident is not None and not hints.alive, "the listener thread ending")
    code, body = get(f"http://127.0.0.1:{worker.health_server.port}/")
    assert code == 503, body
    assert body["status"] == "unhealthy" and body["groups"] == {"health": "healthy"}
    hints = body["hints"]["default"]
    assert hints["status"] == "dead" and not hints["alive"]
    assert "ListenerKilled: the listener thread ends here" in hints["last_error"]


# ---- only the pump's thread touches its driver ----------------------------------------------------


class OwnedDriver(NodeDriver):
    """A real NodeDriver that records every attribute read from a thread other than the one that
    fed it its first event (the pump's), and counts the events it handled."""

    foreign: list[tuple[str, str]] = []
    handled: Counter = Counter()

    def handle(self, event):
        self.__dict__.setdefault("_owner", threading.current_thread())
        type(self).handled[type(event).__name__] += 1
        return super().handle(event)

    def __getattribute__(self, name):
        owner = object.__getattribute__(self, "__dict__").get("_owner")
        if owner is not None and threading.current_thread() is not owner:
            type(self).foreign.append((threading.current_thread().name, name))
        return object.__getattribute__(self, name)


@pytest.fixture
def owned_driver(monkeypatch):
    OwnedDriver.foreign, OwnedDriver.handled = [], Counter()
    monkeypatch.setattr(pump_module, "NodeDriver", OwnedDriver)
    return OwnedDriver


def test_hints_idle_checks_and_health_never_touch_the_driver_off_the_pump_thread(owned_driver):
    """A stress of hints against a pump draining jobs, with the main thread waiting for idle and
    the health endpoint polled meanwhile: not one read of driver state from any of those threads
    (the deque a hint used to iterate is mutated by the pump thread at the same time)."""
    enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(300)])
    group = WorkerGroupOptions(
        name="threads",
        policy=Strict("e2e"),
        pool_size=8,
        max_claim_batch=4,
        poll_interval=0.05,
        maintenance_interval=3600,
        database="default",
    )
    worker = Worker(
        [group],
        store_factory=PostgresStore.from_django,
        registry=TaskRegistry([worker_tasks.noop]),
        health_port=0,
        log_every=0.05,
    )
    (pump,) = worker.pumps
    stop, sent = threading.Event(), Counter()

    def hammer():
        while not stop.is_set():
            pump.hint()
            sent["hints"] += 1
            # The GIL given up between hints: held through whole switch intervals, a tight loop
            # starved the pump and its threads (one to two minutes for 300 no-ops on a slow
            # 2-core machine) while adding no interleaving that a hint per wake-up lacks.
            time.sleep(0)

    def probe():
        while not stop.is_set():
            try:
                code, _ = get(f"http://127.0.0.1:{worker.health_server.port}/")
            except OSError:  # the worker stopped and closed its endpoint
                return
            sent[f"probe {code}"] += 1

    threads = [threading.Thread(target=hammer, name="hint-hammer"), threading.Thread(target=probe, name="health-probe")]
    for thread in threads:
        thread.start()
    try:
        assert worker.run(install_signal_handlers=False, until_idle=True) == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert Job.objects.filter(state="succeeded").count() == 300
    assert sent["hints"] > 100 and sent["probe 200"] > 0 and set(sent) == {"hints", "probe 200"}, sent
    assert owned_driver.foreign == [], f"{len(owned_driver.foreign)} reads off the pump thread, e.g. {owned_driver.foreign[:5]}"
    assert worker.jobs_done == 300


class BlockingFirstClaim:
    """A real store whose first claim waits for ``go``: the pump thread is busy in a store call."""

    def __init__(self):
        self.inner = PostgresStore.from_django()
        self.blocked, self.go = threading.Event(), threading.Event()
        self.claims = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def claim_jobs(self, **kwargs):
        self.claims += 1
        if self.claims == 1:
            self.blocked.set()
            assert self.go.wait(30)
        return self.inner.claim_jobs(**kwargs)


def test_a_burst_of_hints_while_the_pump_is_busy_wakes_it_once_and_costs_one_claim(owned_driver):
    store = BlockingFirstClaim()
    # Room left while the first claim is in flight (it asks for 2 of 4 slots), and no poll due.
    options = WorkerGroupOptions(
        name="burst", policy=Strict("e2e"), pool_size=4, max_claim_batch=2, poll_interval=3600, maintenance_interval=3600
    )
    pump = Pump(options, 0, store_factory=lambda: store, registry=TaskRegistry([worker_tasks.noop]))
    pump.start()
    try:
        assert store.blocked.wait(30)
        for _ in range(1000):
            pump.hint()
    finally:
        store.go.set()
        pump.drain(timeout=5)  # queued behind whatever the hints posted: handled after all of them
        assert pump.join(10)
    assert owned_driver.handled["HintReceived"] == 1
    assert store.claims == 2  # the first poll, and one for the whole burst


# ---- the listener stops at once -------------------------------------------------------------------


def test_stop_ends_the_listeners_wait_at_once_however_long_its_step(caplog):
    """stop() wakes the listener's wait: a cancel request to the server could not (an idle
    LISTEN session runs no query to cancel), so the wait ran to the end of its step, and every
    worker's stop waited for it. A step of a minute here: only a wake-up ends it within the
    five seconds stop() waits for the thread."""
    hints = HintListener(django_conninfo(connection.settings_dict), wait_step=60)
    heard = threading.Event()
    hints.subscribe(["stopping"], heard.set)
    hints.start()
    wait_until(hints.connected.is_set)
    notify("stopping")  # the wait still hears hints
    assert heard.wait(10)

    hints.stop()

    assert not hints.alive
    assert hints.health()["status"] == "stopped"

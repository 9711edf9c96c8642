"""The worker's periodic throughput line: written for an interval in which jobs ran, never for an
idle one (an idle worker's log is its start line, then silence until something happens)."""

from __future__ import annotations

import logging
import threading

import pytest

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.shell.worker import Worker
from backwave.store.postgres import PostgresStore
from backwave.tasking.registry import TaskRegistry
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_throughput_line_is_written_only_for_intervals_in_which_something_happened(caplog):
    group = WorkerGroupOptions(
        name="log", policy=Strict("e2e"), pool_size=4, poll_interval=0.05, maintenance_interval=3600, database="default"
    )
    # An interval far shorter than the pump's idle poll: every poll spans several intervals.
    worker = Worker([group], store_factory=PostgresStore.from_django, registry=TaskRegistry([worker_tasks.noop]), log_every=0.01)
    (pump,) = worker.pumps
    caplog.set_level(logging.INFO, logger="backwave.worker")

    def throughput_lines():
        return [
            r.getMessage() for r in caplog.records if r.name == "backwave.worker" and r.getMessage().startswith("throughput:")
        ]

    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, name="worker-under-test")
    runner.start()
    try:
        # Idle: empty claims, one per poll, each several log intervals apart.
        wait_until(lambda: pump.round_trips >= 6, "idle polls")
        assert throughput_lines() == []

        enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(20)])
        wait_until(lambda: worker.jobs_done == 20, "the jobs to run")
        wait_until(lambda: any("20 done" in line for line in throughput_lines()), "a throughput line for them")

        written = len(throughput_lines())
        idle_from = pump.round_trips
        wait_until(lambda: pump.round_trips >= idle_from + 6, "idle polls after the jobs")
        assert len(throughput_lines()) == written
    finally:
        worker.drain()
        runner.join(30)
    assert not runner.is_alive()

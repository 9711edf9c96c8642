"""A worker in a project without LOGGING (startproject's) still says that it started, with what,
and what it did when it stops: peers' workers all do, and a silent one looks hung."""

from __future__ import annotations

import pytest

from tests.shell import worker_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_worker_without_any_logging_setting_says_it_started_and_what_it_did(start_worker):
    worker_tasks.noop.enqueue()
    worker = start_worker(
        "--queues",
        "e2e",
        "--until-idle",
        "--no-hints",
        "--poll-interval",
        "0.05",
        env={"DJANGO_SETTINGS_MODULE": "tests.settings_nologging"},
    )
    assert worker.wait() == 0, worker.output
    output = worker.output
    from backwave import __version__

    assert "No logging configured for the 'backwave' logger" in output
    started = [line for line in output.splitlines() if "BackWave worker started" in line]
    assert started, output
    assert f"(version {__version__}, pid " in started[0] and "database default)" in started[0]
    assert "cli[e2e] pool=20 pumps=1" in started[0]
    assert "BackWave worker stopped after 1 job(s)" in output

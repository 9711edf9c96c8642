"""Fixtures that run the real ``manage.py backwave_worker`` in a subprocess against the test
database. Tests using them need committed rows: mark them ``django_db(transaction=True)``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection, connections

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate, what: str = "condition", timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen within {timeout}s")


class WorkerProcess:
    """A worker subprocess with its output captured to a file."""

    def __init__(self, args, log_path: Path, env: dict | None = None):
        """``env`` adds variables to the worker's environment; a None value removes one."""
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "BACKWAVE_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
            "BACKWAVE_TEST_OTHER_DATABASE_NAME": connections["other"].settings_dict["NAME"],
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        env = {key: value for key, value in env.items() if value is not None}
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "backwave_worker", *args], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, signum=signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"worker did not exit within {timeout}s; output:\n{self.output}")

    def wait_for(self, predicate, timeout: float = 30, what: str = "condition") -> None:
        """Poll ``predicate`` (a database check) until true; fail with the worker's output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{what} did not happen within {timeout}s (exit code {self.process.poll()}); output:\n{self.output}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def start_worker(tmp_path):
    """start_worker(*args, env=None) -> WorkerProcess; every worker is killed at the test's end."""
    started: list[WorkerProcess] = []

    def start(*args, env=None) -> WorkerProcess:
        worker = WorkerProcess(args, tmp_path / f"worker-{len(started)}.log", env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()

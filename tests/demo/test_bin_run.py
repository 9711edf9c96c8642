"""bin/run supervises its worker: a worker killed with SIGKILL is restarted while the site keeps
answering, and a SIGTERM to bin/run stops every process it started. Real processes throughout:
bin/run itself, its gunicorn and its workers, on this test's database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

from backwave.models import Pump
from tests.database_urls import database_url

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_processes(session_id: int) -> list[int]:
    """Every live process of a session: bin/run, started as a session leader, and all it started."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if fields[0] != "Z" and int(fields[3]) == session_id:
            pids.append(int(entry.name))
    return pids


def status_of(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


class BinRun:
    def __init__(self, log_path: Path):
        self.port = free_port()
        self.log_path = log_path
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": database_url(connection.settings_dict),
            "PORT": str(self.port),
            "STOP_TIMEOUT": "20",
            "PYTHONUNBUFFERED": "1",
        }
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(ROOT / "bin" / "run")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"{what} did not happen within {timeout}s (bin/run exit code {self.process.poll()}); output:\n{self.output}"
        )

    def kill_everything(self) -> None:
        for pid in session_processes(self.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.wait()


def worker_pids() -> set[int]:
    return set(Pump.objects.filter(status="healthy").values_list("pid", flat=True))


@pytest.fixture
def bin_run(tmp_path):
    run = BinRun(tmp_path / "bin-run.log")
    try:
        yield run
    finally:
        run.kill_everything()


def test_a_killed_worker_is_restarted_and_the_site_stays_up(bin_run):
    site = f"http://127.0.0.1:{bin_run.port}/"
    bin_run.wait_for(lambda: status_of(site) == 200 and worker_pids(), "the site and a worker")
    (first,) = worker_pids()

    os.kill(first, signal.SIGKILL)

    bin_run.wait_for(lambda: worker_pids() - {first}, "a new worker")
    (second,) = worker_pids() - {first}
    assert status_of(site) == 200
    assert status_of(f"http://127.0.0.1:{bin_run.port}/admin/login/") == 200
    assert bin_run.process.poll() is None
    assert f"the worker (pid {first}) exited (status 137); restarting it" in bin_run.output

    bin_run.process.send_signal(signal.SIGTERM)
    assert bin_run.process.wait(timeout=60) == 143, bin_run.output
    assert session_processes(bin_run.process.pid) == [], bin_run.output
    assert status_of(site) is None
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)

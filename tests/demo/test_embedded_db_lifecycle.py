"""A real embedded PostgreSQL on a private data folder: bin/test says it started one that keeps
running and how to stop it, and `embedded_db stop --unless-in-use` (what bin/run asks at its
end) leaves it to whoever still uses it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from project import database

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def private_pgdata():
    # Not under pytest's tmp_path (owner-only): run as root, the server runs as its own user.
    folder = Path(tempfile.mkdtemp(prefix="backwave-pgdata-"))
    folder.chmod(0o755)
    data = folder / "pgdata"
    env = {**os.environ, "BACKWAVE_PGDATA": str(data)}
    env.pop("DATABASE_URL", None)
    try:
        yield data, env
    finally:
        subprocess.run([sys.executable, "manage.py", "embedded_db", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=120)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def embedded_db(env, *args):
    return subprocess.run(
        [sys.executable, "manage.py", "embedded_db", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_bin_test_says_the_embedded_server_it_started_keeps_running_and_how_to_stop_it(private_pgdata):
    data, env = private_pgdata
    run = subprocess.run(
        [str(ROOT / "bin" / "test"), "tests/demo/test_runs.py", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "bin/test: the embedded PostgreSQL this run started keeps running" in run.stderr, run.stderr
    assert f"stop it with: BACKWAVE_PGDATA={data} " in run.stderr and "manage.py embedded_db stop" in run.stderr
    assert embedded_db(env, "status").returncode == 0

    again = subprocess.run(
        [str(ROOT / "bin" / "test"), "tests/demo/test_runs.py", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "keeps running" not in again.stderr  # it started nothing this time

    assert_stops_it_from_anywhere(re.search(r"stop it with: (.+)$", run.stderr, re.MULTILINE).group(1), env)


def assert_stops_it_from_anywhere(command: str, env: dict) -> None:
    """``command`` as printed, run from another directory with the virtualenv not activated (no
    VIRTUAL_ENV, no venv on PATH, so a bare `python` is not the project's) stops the server."""
    bare = {"PATH": "/usr/bin:/bin", "HOME": env.get("HOME", "/"), "LANG": "C.UTF-8"}
    stopped = subprocess.run(["bash", "-c", command], cwd="/", env=bare, capture_output=True, text=True, timeout=120, check=False)
    assert stopped.returncode == 0 and "embedded PostgreSQL stopped" in stopped.stdout, (command, stopped.stdout, stopped.stderr)
    assert embedded_db(env, "status").returncode == 3


def test_stop_unless_in_use_leaves_a_server_someone_still_uses(private_pgdata, monkeypatch):
    data, env = private_pgdata
    assert embedded_db(env, "start").returncode == 0
    monkeypatch.setattr(database, "EMBEDDED_DATA_DIR", data)
    info = database.embedded_server_info()
    with psycopg.connect(host=str(info.socket_dir), port=info.port, user="postgres", dbname="postgres") as session:
        kept = embedded_db(env, "stop", "--unless-in-use")
        assert kept.returncode == 0, kept.stderr
        assert "left running: 1 other session(s) still use it" in kept.stdout
        assert session.execute("SELECT 1").fetchone() == (1,)
    stopped = embedded_db(env, "stop", "--unless-in-use")
    assert "embedded PostgreSQL stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert embedded_db(env, "status").returncode == 3


def test_the_stop_command_bin_run_prints_works_from_anywhere_without_the_virtualenv(private_pgdata, monkeypatch):
    """What bin/run prints at its end while a session still uses the server: a command that an
    operator can paste in any terminal, the virtualenv not activated."""
    data, env = private_pgdata
    assert embedded_db(env, "start").returncode == 0
    monkeypatch.setattr(database, "EMBEDDED_DATA_DIR", data)
    info = database.embedded_server_info()
    with psycopg.connect(host=str(info.socket_dir), port=info.port, user="postgres", dbname="postgres"):
        kept = embedded_db(env, "stop", "--unless-in-use")
    command = re.search(r"stop it with: (.+)$", kept.stdout, re.MULTILINE).group(1)
    assert command.startswith(f"BACKWAVE_PGDATA={data} /"), command
    assert_stops_it_from_anywhere(command, env)

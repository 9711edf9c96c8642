"""SQLite, as startproject leaves a project: `check` says backwave.E102, and so does `migrate`,
with or without its system checks, before it writes anything; never a traceback from a
statement PostgreSQL alone understands."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def manage(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings_sqlite", "BACKWAVE_TEST_SQLITE_DIR": str(folder)}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def tables(folder: Path) -> set[str]:
    path = folder / "default.sqlite3"
    if not path.exists():
        return set()
    with sqlite3.connect(path) as connection:
        return {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_check_says_e102(tmp_path):
    checked = manage(tmp_path, "check")
    assert checked.returncode == 1
    assert "backwave.E102" in checked.stderr and "Traceback" not in checked.stderr, checked.stderr


@pytest.mark.parametrize("flags", [(), ("--skip-checks",)])
def test_migrate_refuses_with_e102_before_it_writes_anything(tmp_path, flags):
    migrated = manage(tmp_path, "migrate", "--noinput", *flags)
    assert migrated.returncode == 1, migrated.stdout + migrated.stderr
    output = migrated.stdout + migrated.stderr
    assert "backwave.E102" in output and "BackWave needs PostgreSQL" in output, output
    assert "Traceback" not in output and "OperationalError" not in output, output
    assert not any(name.startswith("backwave_") for name in tables(tmp_path))
    assert "django_migrations" not in tables(tmp_path) or not flags, "nothing applied before the refusal"

"""The demo never runs with a SECRET_KEY everyone can read in its source (run tokens and sessions
are signed with it): the environment's SECRET_KEY, else a key generated once per checkout into a
git-ignored file only its owner can read.

Each check loads ``project.settings`` in a fresh interpreter, from a copy of ``project/`` in a
temporary checkout, so the key file it creates lands there and not in this one."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
OLD_PUBLIC_KEY = "backwave-demo-insecure-key-change-me-in-production"


@pytest.fixture
def checkout(tmp_path) -> Path:
    shutil.copytree(REPOSITORY / "project", tmp_path / "project", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def loaded_key(checkout: Path, **environment: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in ("SECRET_KEY", "SECRET_KEY_FILE")}
    # Any URL: settings only parse it, and a set DATABASE_URL keeps the embedded server out of it.
    env["DATABASE_URL"] = "postgres://nobody@127.0.0.1:1/nothing"
    env["PYTHONPATH"] = str(checkout)
    env.update(environment)
    return subprocess.run(
        [sys.executable, "-c", "import project.settings as s; print(s.SECRET_KEY)"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_secret_key_one_is_generated_per_checkout_and_kept(checkout):
    first = loaded_key(checkout)
    second = loaded_key(checkout)

    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert key != OLD_PUBLIC_KEY
    assert len(key) >= 50
    assert second.stdout.strip() == key
    key_file = checkout / ".secret_key"
    assert key_file.read_text().strip() == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert sorted(path.name for path in checkout.iterdir()) == [".secret_key", "project"]  # no temporary left over


def test_another_checkout_gets_another_key(checkout, tmp_path_factory):
    other = tmp_path_factory.mktemp("other")
    shutil.copytree(checkout / "project", other / "project")
    assert loaded_key(checkout).stdout.strip() != loaded_key(other).stdout.strip()


def test_the_environments_secret_key_wins_and_no_file_is_written(checkout):
    result = loaded_key(checkout, SECRET_KEY="from-the-environment-" + "x" * 40)
    assert result.stdout.strip() == "from-the-environment-" + "x" * 40
    assert not (checkout / ".secret_key").exists()


def test_secret_key_file_moves_the_key_file(checkout, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "demo.key"
    key = loaded_key(checkout, SECRET_KEY_FILE=str(key_file)).stdout.strip()
    assert key_file.read_text().strip() == key
    assert not (checkout / ".secret_key").exists()


def test_an_empty_key_file_is_a_clear_error_not_an_empty_key(checkout):
    (checkout / ".secret_key").write_text("\n")
    result = loaded_key(checkout)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert ".secret_key is empty: delete it to have a new key generated, or set SECRET_KEY" in result.stderr


def test_the_key_file_is_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "--quiet", ".secret_key"], cwd=REPOSITORY)
    assert ignored.returncode == 0


def test_the_source_carries_no_usable_default_key():
    source = (REPOSITORY / "project" / "settings.py").read_text()
    assert OLD_PUBLIC_KEY not in source

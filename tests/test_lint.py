"""`ruff check` and `ruff format --check` pass on the whole tree, with the settings pyproject.toml's [tool.ruff] gives."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_ruff_format_changes_nothing():
    formatting = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--no-cache", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert formatting.returncode == 0, formatting.stdout + formatting.stderr

"""`ruff check` passes on the whole tree, with the rules pyproject.toml's [tool.ruff] sets."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr

"""A user's type checker on code that uses BackWave, against the installed wheel: mypy in strict
mode (the suite's own mypy, pointed at the lane's virtualenv with ``--python-executable``, so it
reads the package and its ``py.typed`` marker exactly as installed, not the checkout).

mypy rather than pyright: it installs from the package index as a plain wheel (pyright's needs
Node.js fetched at run time) and checks these snippets in a few seconds.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from .environment import run

pytestmark = pytest.mark.slow

SNIPPETS = Path(__file__).with_name("typed")


def mypy(venv, folder: Path, module: str):
    shutil.copy(SNIPPETS / module, folder / module)
    strict = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", folder / ".mypy_cache"]
    return run([*strict, "--python-executable", venv.python, module], cwd=folder, timeout=300)


def test_typed_user_code_passes_mypy_strict(venv, tmp_path):
    checked = mypy(venv, tmp_path, "user_code.py")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 1 source file" in checked.stdout


def test_mypy_refuses_wrong_arguments_to_the_public_api(venv, tmp_path):
    """The names have real types, not Any: each wrong call is an error on its own line."""
    checked = mypy(venv, tmp_path, "user_mistakes.py")
    errors = re.findall(r"^user_mistakes\.py:(\d+): error: .*\[(?:arg-type|call-overload)\]$", checked.stdout, re.M)
    source = (SNIPPETS / "user_mistakes.py").read_text().splitlines()
    calls = [str(number) for number, line in enumerate(source, 1) if line and not line.startswith(('"', "import", "from"))]
    assert errors == calls, checked.stdout

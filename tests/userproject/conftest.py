"""The user's-project lane: BackWave as a new user meets it, from the built wheel.

One sdist and wheel are built per session (``python -m build``, the wheel from the sdist, as
an index would serve them), and one virtualenv outside the checkout gets the wheel and what
the tutorial installs, from the package index like any user's (versions held to
requirements.txt's pins). Each project (``project.py``) is made in a temporary folder with
``django-admin startproject`` and the tutorial applied to it, on its own fresh database of the
server the suite uses; nothing of the checkout is importable there.
"""

from __future__ import annotations

import os
import sys

import pytest

from .environment import ROOT, TUTORIAL_INSTALLS, Dist, Venv, pinned_constraints, run


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Dist:
    """The sdist and the wheel built from it, as `python -m build` makes them for an upload."""
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=ROOT, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Dist(wheel=wheel, sdist=sdist)


@pytest.fixture(scope="session")
def venv(dist, tmp_path_factory) -> Venv:
    """A fresh virtualenv outside the checkout with the wheel and the tutorial's other installs."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    made = run([sys.executable, "-m", "venv", root], timeout=300)
    assert made.returncode == 0, made.stderr
    env = Venv(root)
    constraints = pinned_constraints(root.parent / "constraints.txt")
    installed = run(
        [
            env.python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            "-c",
            constraints,
            dist.wheel,
            *TUTORIAL_INSTALLS,
        ],
        cwd=root.parent,
        timeout=900,
        env={k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}},
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return env


@pytest.fixture(scope="session")
def server() -> dict:
    """libpq's environment for the suite's PostgreSQL server (DATABASE_URL's or the embedded one)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    env = {"PGHOST": db.get("HOST") or "127.0.0.1", "PGPORT": str(db.get("PORT") or 5432), "PGUSER": db["USER"]}
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = db["PASSWORD"]
    return env

"""What `python -m build` makes of the checkout: every file of the package in the wheel and the
sdist (templates, static files, SQL, migrations, the py.typed marker), and the metadata an
index shows."""

from __future__ import annotations

import email
import subprocess
import tarfile
import zipfile

import pytest

from .environment import ROOT

pytestmark = pytest.mark.slow

# Named as well as compared with git: a file missing from both the checkout and the wheel fails too.
REQUIRED = [
    "backwave/py.typed",
    "backwave/static/backwave/live.js",
    "backwave/static/backwave/local_times.js",
    "backwave/templates/admin/backwave/includes/dashboard.html",
    "backwave/store/queries.sql",
    "backwave/migrations/0001_initial.py",
]


def package_files() -> set[str]:
    """Every file of the backwave package the checkout tracks."""
    listed = subprocess.run(["git", "ls-files", "backwave"], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(listed.stdout.split())


def test_the_wheel_holds_every_file_of_the_package(dist):
    names = set(dist.wheel_names())
    in_package = {name for name in names if name.startswith("backwave/")}
    assert [name for name in REQUIRED if name not in names] == []
    assert sorted(package_files() - in_package) == []


def test_the_sdist_holds_every_file_of_the_package_and_builds_that_wheel(dist):
    with tarfile.open(dist.sdist) as archive:
        prefix = archive.getnames()[0].split("/")[0] + "/"
        names = {name.removeprefix(prefix) for name in archive.getnames()}
    assert [name for name in REQUIRED if name not in names] == []
    assert sorted(package_files() - names) == []
    assert {"README.md", "pyproject.toml"} <= names


def test_the_metadata_says_what_it_runs_on_and_that_it_is_typed(dist):
    with zipfile.ZipFile(dist.wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        message = email.message_from_bytes(archive.read(metadata))
    classifiers = message.get_all("Classifier") or []
    for expected in (
        "Framework :: Django",
        "Framework :: Django :: 6.1",
        "Programming Language :: Python :: 3.12",
        "Typing :: Typed",
    ):
        assert expected in classifiers
    assert message["Name"] == "django-backwave"

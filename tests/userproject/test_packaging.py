"""What `python -m build` makes of the checkout: every file of the package in the wheel and the
sdist (templates, static files, SQL, migrations, the py.typed marker), the license, and the
metadata an index shows (its long description is the README, whose links must work there)."""

from __future__ import annotations

import email
import subprocess
import tarfile
import zipfile

import pytest

from ..test_docs import links
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
    assert {"README.md", "pyproject.toml", "LICENSE"} <= names


def metadata(dist) -> email.message.Message:
    with zipfile.ZipFile(dist.wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_wheel_and_the_sdist_carry_the_mit_license(dist):
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "BackWave contributors" in text
    with zipfile.ZipFile(dist.wheel) as archive:
        (licensed,) = [name for name in archive.namelist() if name.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licensed).decode() == text
    message = metadata(dist)
    assert message["License-Expression"] == "MIT"
    assert message.get_all("License-File") == ["LICENSE"]


def test_the_long_description_is_the_readme_with_only_absolute_links(dist):
    message = metadata(dist)
    assert message["Description-Content-Type"] == "text/markdown"
    description = message.get_payload(decode=True).decode("utf-8")
    assert description.strip() == (ROOT / "README.md").read_text().strip()
    found = links(description)
    assert found and [url for url in found if not url.startswith(("https://", "#"))] == []
    urls = dict(value.split(", ", 1) for value in message.get_all("Project-URL") or [])
    assert sorted(urls) == ["Changelog", "Documentation", "Homepage", "Issues", "Repository"]


def test_the_metadata_says_what_it_runs_on_and_that_it_is_typed(dist):
    message = metadata(dist)
    classifiers = message.get_all("Classifier") or []
    for expected in (
        "Framework :: Django",
        "Framework :: Django :: 6.1",
        "Programming Language :: Python :: 3.12",
        "Typing :: Typed",
    ):
        assert expected in classifiers
    assert message["Name"] == "django-backwave"

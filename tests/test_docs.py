"""The docs site builds in strict mode, and the README stays an introduction.

`mkdocs build --strict` fails on a broken link, a missing anchor, a nav entry without its page,
an unresolved API reference or a reference table the hook cannot generate (docs/hooks/reference.py):
a change that breaks the docs fails the suite, and so CI.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def test_the_docs_build_strictly(tmp_path):
    # The hook configures Django with a fresh project's settings: not the tests' own.
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env["NO_MKDOCS_2_WARNING"] = "1"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    settings_page = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
    from backwave import conf

    # Generated, not written: every key of the one table has its entry.
    missing = [name for name in conf.DEFAULTS if f'id="{name.lower().replace("_", "-")}"' not in settings_page]
    assert not missing, f"settings without an entry on the generated page: {missing}"
    from django.core.management import get_commands

    commands_page = (tmp_path / "site" / "reference" / "commands" / "index.html").read_text()
    ours = [name for name, app in get_commands().items() if app == "backwave"]
    assert ours and not [name for name in ours if f'id="{name.replace("_", "-")}"' not in commands_page]


def test_the_readme_is_an_introduction():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): put the longer prose in the matching page under docs/"
    )
    commands = [line.split()[0] for line in lines if line.startswith("bin/")]
    assert commands[:2] == ["bin/run", "bin/test"], "the README's first two commands are bin/run and bin/test"


# A Markdown link's target, inline or as a reference definition; an HTML link's.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)|^\s*\[[^\]]+\]:\s*<?(\S+?)>?\s*$|\bhref=[\"']([^\"']+)", re.M)


def links(markdown: str) -> list[str]:
    return [next(group for group in match.groups() if group) for match in LINK.finditer(markdown)]


def docs_page(url: str, site_url: str) -> Path | None:
    """The docs/ source of a page of the site (use_directory_urls: docs/a/b.md is served at a/b/)."""
    path = url.removeprefix(site_url).split("#", 1)[0].strip("/")
    for candidate in (f"{path}.md", f"{path}/index.md") if path else ("index.md",):
        if (ROOT / "docs" / candidate).is_file():
            return ROOT / "docs" / candidate
    return None


def test_the_readme_links_absolutely_to_pages_that_exist():
    """The README is the package index's long description, where a relative link is broken: each
    link is absolute, and one into the docs site names a page docs/ has."""
    import tomllib

    site_url = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.M).group(1)
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] == site_url
    found = links((ROOT / "README.md").read_text())
    assert found, "no link found: the pattern no longer matches the README's links"
    assert [url for url in found if not url.startswith(("https://", "#"))] == []
    assert [url for url in found if url.startswith(site_url) and docs_page(url, site_url) is None] == []

"""Browser tests: headless Chromium from the distribution (never a browser download), driven by
Playwright, against pytest-django's live server and, where jobs must run, a real worker process.

They are skipped, with the reason, only when Chromium or Playwright is genuinely missing;
.ci/run installs both, so CI runs them. Screenshots go to artifacts/screenshots/ (git-ignored).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.shell.conftest import start_worker  # noqa: F401  (the real worker in a subprocess)

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("BACKWAVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 20_000


def _unavailable() -> str | None:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"Chromium not found at {CHROMIUM} (Debian: apt-get install -y chromium; .ci/run installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -r requirements.txt)"
    return None


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module.

    Playwright's sync API keeps an event loop running in this thread, which Django reads as "async
    context" and would refuse ORM calls in; the tests' own ORM calls are plain synchronous code
    in between browser calls, so the guard is lifted while the browser lives, and only then.
    """
    if reason := _unavailable():
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def screenshot():
    """screenshot(page, name): a full-page PNG under artifacts/screenshots/; returns its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


def log_in(page, live_server, username: str, password: str) -> None:
    """Through the admin's own login form."""
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")

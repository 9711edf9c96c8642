"""The tutorial (docs/tutorial.md) followed as written, in a fresh project made by
``django-admin startproject`` with the built wheel: migrate, a plain ``backwave_worker``, a
signup through runserver whose job runs, the admin's pages and their static files (runserver's
DEBUG serving, then ``collectstatic`` with ``ManifestStaticFilesStorage``), the tutorial's own
test, and the operator's entry points (the jobs CLI, ``backwave.cancel()``, health, metrics).
Each with and without ``django.contrib.admin`` in INSTALLED_APPS (the pages only with it)."""

from __future__ import annotations

import re
from functools import cached_property

import pytest

from .project import METRICS_TOKEN, SUPERUSER, Browser, Project, drop_database

pytestmark = pytest.mark.slow

KINDS = ["admin", "no-admin"]
MANIFEST_SETTINGS = """from .settings import *  # noqa: F403

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
STATIC_ROOT = BASE_DIR / "collected"  # noqa: F405
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
}
"""
SCRIPT = re.compile(r'<script src="(?P<src>[^"]*backwave/[^"]+\.js)"')


class Made:
    """A project followed through the tutorial once, shared by the module's tests."""

    def __init__(self, project: Project):
        self.project = project
        self.error: str | None = None

    @cached_property
    def signup(self) -> tuple[int, str]:
        """(job id, its state once final) of one signup through the tutorial's view."""
        answer = self.project.browser.post_form("/signup/", {"email": "ada@example.com"})
        assert answer.status == 201, f"signup answered {answer.status}: {answer.body[:2000]}"
        job_id = int(re.search(r"job (\d+)", answer.body)[1])
        return job_id, self.project.wait_for_job(job_id)


@pytest.fixture(scope="module")
def projects(venv, server, tmp_path_factory):
    made: dict[str, Made] = {}

    def get(kind: str) -> Project:
        if kind not in made:
            project = Project.make(tmp_path_factory.mktemp(kind), venv, server, admin=kind == "admin")
            made[kind] = Made(project)
            try:
                project.follow_tutorial()
            except BaseException as error:  # every later test of this kind says the same
                made[kind].error = f"following the tutorial ({kind}) failed: {error}"
                raise
        if made[kind].error:
            pytest.fail(made[kind].error)
        return made[kind]

    yield get
    for each in made.values():
        each.project.stop()
        drop_database(each.project)


@pytest.mark.parametrize("kind", KINDS)
def test_the_signup_job_runs_on_a_plain_worker(projects, kind):
    made = projects(kind)
    job_id, state = made.signup
    worker = made.project.background["worker"]
    assert state == "succeeded", (
        f"job {job_id} is {state}: {made.project.sql('SELECT queue, attempts FROM backwave_job WHERE id = %s', [job_id])}; "
        f"worker log:\n{worker.output()[-3000:]}"
    )
    assert "Subject: Welcome!" in worker.output()  # the console mail backend, in the worker's terminal


@pytest.mark.parametrize("kind", KINDS)
def test_the_worker_says_it_started_without_any_logging_setting(projects, kind):
    made = projects(kind)
    assert "LOGGING" not in (made.project.root / "mysite" / "settings.py").read_text()
    output = made.project.background["worker"].output()
    started = [line for line in output.splitlines() if "BackWave worker" in line and "started" in line]
    assert started, f"no start line in the worker's output:\n{output[-3000:]}"
    assert "emails" in started[0] and "default" in started[0]


@pytest.mark.parametrize("kind", KINDS)
def test_check_finds_nothing_to_say(projects, kind):
    checked = projects(kind).project.must("check")
    assert "System check identified no issues" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_the_tutorials_own_test_passes(projects, kind):
    ran = projects(kind).project.results["pytest"]
    assert ran.returncode == 0, ran.stdout[-5000:] + ran.stderr[-3000:]
    assert "1 passed" in ran.stdout


ADMIN_PAGES = ["/admin/backwave/", "/admin/backwave/job/", "/admin/backwave/job/{job}/change/", "/admin/backwave/queue/"]


def admin_pages(browser: Browser, job_id: int, server) -> dict[str, str]:
    """Each page's body, once it answered 200 (else the server's log says why)."""
    bodies = {}
    for path in ADMIN_PAGES:
        page = browser.request(path.format(job=job_id))
        assert page.status == 200, f"{path} answered {page.status}; the server's log:\n{server.output()[-2000:]}"
        bodies[path] = page.body
    return bodies


def scripts(bodies: dict[str, str]) -> set[str]:
    return {match["src"] for body in bodies.values() for match in SCRIPT.finditer(body)}


def test_the_admin_pages_and_their_static_files_under_runserver(projects):
    made = projects("admin")
    job_id, _state = made.signup
    browser = Browser(made.project.browser.base)
    browser.sign_in(*SUPERUSER)
    bodies = admin_pages(browser, job_id, made.project.background["web"])
    assert "accounts.tasks.send_welcome" in bodies["/admin/backwave/job/{job}/change/"]
    found = scripts(bodies)
    assert {src.rsplit("/", 1)[1] for src in found} == {"live.js", "local_times.js"}, found
    for src in sorted(found):
        served = browser.request(src)
        assert served.status == 200 and served.body.strip(), f"{src} answered {served.status}"


def test_the_admin_pages_after_collectstatic_with_manifest_storage(projects):
    made = projects("admin")
    project = made.project
    job_id, _state = made.signup
    (project.root / "mysite" / "lane_collected.py").write_text(MANIFEST_SETTINGS)
    collected = {"DJANGO_SETTINGS_MODULE": "mysite.lane_collected"}
    project.must("collectstatic", "--noinput", env=collected)
    browser = project.serve("web-collected", collected)
    browser.sign_in(*SUPERUSER)
    found = scripts(admin_pages(browser, job_id, project.background["web-collected"]))
    hashed = {src.rsplit("/", 1)[1] for src in found}
    assert len(hashed) == 2 and all(re.fullmatch(r"(live|local_times)\.[0-9a-f]{12}\.js", name) for name in hashed), found
    for src in found:
        assert (project.root / "collected" / src.split("/static/", 1)[1]).is_file(), src


@pytest.mark.parametrize("kind", KINDS)
def test_the_operators_entry_points(projects, kind):
    made = projects(kind)
    project = made.project
    job_id, _state = made.signup

    listed = project.must("backwave_jobs", "list")
    assert re.search(rf"^\s*{job_id}\b.*succeeded", listed.stdout, re.MULTILINE), listed.stdout

    cancelled = project.must("shell", "-c", CANCEL_LATER_JOB)
    later_id, outcome = re.search(r"^lane: (\d+) (\w+)$", cancelled.stdout, re.MULTILINE).groups()
    assert outcome == "cancelled", cancelled.stdout
    assert project.sql("SELECT state FROM backwave_job WHERE id = %s", [int(later_id)]) == [("cancelled",)]

    health = project.must("backwave_health")
    assert "healthy" in health.stdout

    anonymous = project.browser.request("/backwave/metrics")
    assert anonymous.status == 401
    metrics = project.browser.request("/backwave/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert metrics.status == 200, metrics.body[:3000]
    assert 'backwave_jobs{database="default",queue="emails",state="ready"} 0.0' in metrics.body
    assert 'backwave_pumps{database="default",group="default",status="healthy"} 1.0' in metrics.body, metrics.body


CANCEL_LATER_JOB = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
import backwave
from accounts.tasks import send_welcome
user = get_user_model().objects.get(username="ada@example.com")  # the signup's (the superuser shares its address)
later = send_welcome.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(user.pk)
print("lane:", later.id, backwave.cancel(later.id))
"""

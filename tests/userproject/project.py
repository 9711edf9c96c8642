"""A user's project made from the tutorial: its processes, its database, an HTTP client.

``Project.follow_tutorial`` runs ``django-admin startproject`` in a temporary folder and walks the
tutorial's steps in the page's order (``tutorial.py``): files are written as the page says, and
each command line is one the lane knows how to run (below); a command it does not know fails
the lane, so the page cannot grow a step that nothing runs. The worker and the web server are
real processes of the project's own virtualenv, left running for the tests.

Without the admin (``admin=False``), ``django.contrib.admin`` is taken out of startproject's
INSTALLED_APPS and urls.py, as an API-only project has it. The lane adds one thing of its own to
every project: BackWave's URLs with a metrics token, so the tests can read the metrics.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from . import tutorial
from .environment import TUTORIAL_INSTALLS, Venv, run

METRICS_TOKEN = "lane-metrics-token-0123456789abcdef"
SUPERUSER = ("ada", "ada-lane-password-123")
LANE_SETTINGS = f"""

# The lane's own (tests/userproject), not the tutorial's: BackWave's metrics for the tests.
BACKWAVE = {{**globals().get("BACKWAVE", {{}}), "METRICS_TOKEN": {METRICS_TOKEN!r}}}
"""
LANE_URLS = """

# The lane's own (tests/userproject), not the tutorial's.
from django.urls import include  # noqa: E402

urlpatterns += [path("backwave/", include("backwave.urls"))]
"""
WAIT = 90.0  # seconds a process gets to come up, or a job to finish: a bound, never asserted


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Response:
    status: int
    body: str
    headers: dict


class Browser:
    """An HTTP client with a cookie jar: what the lane's "user" sends to runserver."""

    def __init__(self, base: str):
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def request(self, path: str, data: dict | None = None, headers: dict | None = None) -> Response:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        try:
            with self.opener.open(request, timeout=60) as answer:
                return Response(answer.status, answer.read().decode(errors="replace"), dict(answer.headers))
        except urllib.error.HTTPError as error:
            return Response(error.code, error.read().decode(errors="replace"), dict(error.headers))

    def post_form(self, path: str, fields: dict) -> Response:
        """GET the page's form, then POST it back with its CSRF token."""
        page = self.request(path)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.body)
        assert token, f"no CSRF token in {path}: {page.status} {page.body[:500]}"
        return self.request(path, {"csrfmiddlewaretoken": token[1], **fields})

    def sign_in(self, username: str, password: str) -> None:
        answer = self.post_form("/admin/login/", {"username": username, "password": password, "next": "/admin/"})
        assert answer.status == 200 and "logout" in answer.body.lower(), (
            f"admin sign-in failed: {answer.status} {answer.body[:500]}"
        )


@dataclass
class Background:
    name: str
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


@dataclass
class Project:
    root: Path
    venv: Venv
    env: dict
    database: str
    admin: bool
    background: dict[str, Background] = field(default_factory=dict)
    results: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    port: int | None = None

    # ---- running things ---------------------------------------------------------------------------

    def manage(self, *args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return run([self.venv.python, "manage.py", *args], cwd=self.root, env={**self.env, **(env or {})}, timeout=timeout)

    def must(self, *args, **kwargs) -> subprocess.CompletedProcess:
        done = self.manage(*args, **kwargs)
        assert done.returncode == 0, (
            f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
        return done

    def start(self, name: str, argv: list[str], env: dict | None = None) -> Background:
        log = self.root.parent / f"{self.root.name}-{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [str(a) for a in argv], cwd=self.root, env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT
            )
        self.background[name] = Background(name, process, log)
        return self.background[name]

    def serve(self, name: str, env: dict | None = None, *extra: str) -> Browser:
        """runserver on a free port (no autoreloader: one process to stop), once it answers."""
        port = free_port()
        server = self.start(
            name, [self.venv.python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", *extra], env=env
        )
        browser = Browser(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                pytest.fail(f"runserver exited {server.process.returncode}:\n{server.output()[-5000:]}")
            try:
                browser.request("/signup/")
                return browser
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"runserver did not answer within {WAIT:.0f}s:\n{server.output()[-5000:]}")

    def stop(self) -> None:
        # The web server first, as a deployment does, then the worker (it drains).
        for name in sorted(self.background, key=lambda n: n == "worker"):
            self.background[name].stop()

    def sql(self, statement: str, params=()) -> list[tuple]:
        with psycopg.connect(dbname=self.database, **_libpq(self.env), autocommit=True) as connection:
            return connection.execute(statement, params).fetchall()

    def wait_for_job(self, job_id: int) -> str:
        """The job's state once it is final, or the state it was left in when WAIT ran out."""
        deadline = time.monotonic() + WAIT
        state = None
        while time.monotonic() < deadline:
            (state,) = self.sql("SELECT state FROM backwave_job WHERE id = %s", [job_id])[0]
            if state in {"succeeded", "failed", "cancelled", "quarantined"}:
                return state
            time.sleep(0.2)
        return state

    # ---- the tutorial ------------------------------------------------------------------------------

    @classmethod
    def make(cls, folder: Path, venv: Venv, server: dict, *, admin: bool) -> Project:
        """An empty project folder, its environment and the name of its fresh database."""
        database = f"bw_userproject_{os.getpid()}_{'admin' if admin else 'noadmin'}"
        root = folder / "mysite"
        root.mkdir()
        env = {
            "PATH": f"{venv.bin}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", str(folder)),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "VIRTUAL_ENV": str(venv.root),
            **server,
            "PGDATABASE": database,
        }
        return cls(root=root, venv=venv, env=env, database=database, admin=admin)

    def follow_tutorial(self) -> None:
        for step in tutorial.steps():
            if isinstance(step, tutorial.FileStep):
                target = tutorial.apply_file(self.root, step)
                lane_addition = {"mysite/settings.py": LANE_SETTINGS, "mysite/urls.py": LANE_URLS}.get(step.path)
                if lane_addition:
                    target.write_text(target.read_text() + lane_addition)
            else:
                self.run_command(step)

    def run_command(self, step: tutorial.CommandStep) -> None:
        argv = step.argv
        if argv in (["python", "-m", "venv", ".venv"], ["source", ".venv/bin/activate"]):
            return  # the session's virtualenv, outside the project, stands for it
        if argv[:2] == ["pip", "install"]:
            for name in argv[2:]:
                assert name == "django-backwave" or name in TUTORIAL_INSTALLS, (
                    f"the lane does not install {name!r} (conftest.TUTORIAL_INSTALLS)"
                )
                assert self.venv.has(name), f"{name} is not installed in the lane's virtualenv"
            return
        if argv[:2] == ["django-admin", "startproject"]:
            done = run([self.venv.bin / "django-admin", *argv[1:]], cwd=self.root, env=self.env, timeout=120)
            assert done.returncode == 0, done.stderr
            if not self.admin:
                self._without_admin()
            return
        if argv[0] == "createdb":
            # The page's database name stands for a fresh one per project (PGDATABASE, which the
            # page's settings read), dropped by the fixture that made it.
            with psycopg.connect(dbname="postgres", **_libpq(self.env), autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{self.database}"')
                connection.execute(f'CREATE DATABASE "{self.database}"')
            return
        if argv == ["pytest"]:
            self.results["pytest"] = run(
                [self.venv.bin / "pytest", "-q", "-p", "no:cacheprovider"], cwd=self.root, env=self.env, timeout=600
            )
            return
        if argv[:2] != ["python", "manage.py"]:
            pytest.fail(f"the lane does not know how to run the tutorial's command {step.line!r} (tests/userproject/project.py)")
        command = argv[2:]
        if command[0] == "createsuperuser":
            username, password = SUPERUSER
            self.must(
                *command,
                "--noinput",
                "--username",
                username,
                "--email",
                "ada@example.com",
                env={"DJANGO_SUPERUSER_PASSWORD": password},
            )
        elif command[0] == "backwave_worker":
            self.start("worker", [self.venv.python, "manage.py", *command])
        elif command[0] == "runserver":
            self.browser = self.serve("web")
        elif command[0] in {"migrate", "startapp", "check"}:
            self.results[command[0]] = self.must(*command)
        else:
            pytest.fail(f"the lane does not know how to run the tutorial's command {step.line!r} (tests/userproject/project.py)")

    def _without_admin(self) -> None:
        """startproject's settings and URLs less django.contrib.admin, as an API-only project has them."""
        for path, line in (
            ("mysite/settings.py", "    'django.contrib.admin',\n"),
            ("mysite/urls.py", "from django.contrib import admin\n"),
            ("mysite/urls.py", "    path('admin/', admin.site.urls),\n"),
        ):
            target = self.root / path
            text = target.read_text()
            assert line in text, f"startproject's {path} no longer has {line!r}: update the lane"
            target.write_text(text.replace(line, ""))


def _libpq(env: dict) -> dict:
    names = {"PGHOST": "host", "PGPORT": "port", "PGUSER": "user", "PGPASSWORD": "password"}
    return {names[k]: v for k, v in env.items() if k in names}


def drop_database(project: Project) -> None:
    with psycopg.connect(dbname="postgres", **_libpq(project.env), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{project.database}" WITH (FORCE)')

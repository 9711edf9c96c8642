"""DATABASE_URL as the demo's settings read it: libpq's URI forms, including a unix socket
directory written as a percent-encoded host (``postgresql://%2Fvar%2Frun%2Fpostgresql/db``), the
form libpq documents and dj-database-url reads. django-environ alone leaves that host encoded, and
psycopg then tries to resolve ``%2Fvar...`` as a host name.

Each case loads ``project.settings`` in a fresh interpreter, as a process started with that
environment would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]


def database_settings(url: str) -> dict:
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "test-only-key"}
    done = subprocess.run(
        [sys.executable, "-c", "import json, project.settings as s; print(json.dumps(s.DATABASES['default']))"],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("url", "host", "port", "name"),
    [
        ("postgres://postgres@%2Fwork%2FSome%20Dir%2F.pgdata:5433/app", "/work/Some Dir/.pgdata", 5433, "app"),
        ("postgresql://%2Fvar%2Frun%2Fpostgresql/app", "/var/run/postgresql", "", "app"),
        ("postgres://postgres@db.example.com:5432/app", "db.example.com", 5432, "app"),
        ("postgres://postgres@127.0.0.1/app%20two", "127.0.0.1", "", "app two"),
    ],
    ids=["encoded-socket-dir-and-port", "encoded-socket-dir", "host-name", "address"],
)
def test_a_database_url_names_the_host_libpq_would_connect_to(url, host, port, name):
    config = database_settings(url)
    assert (config["HOST"], config["PORT"], config["NAME"]) == (host, port, name)


def test_a_socket_directory_given_as_a_query_parameter_still_reaches_psycopg():
    config = database_settings("postgres://postgres@/app?host=/work/main/.pgdata&port=5433")
    assert config["OPTIONS"] == {"host": "/work/main/.pgdata", "port": 5433}

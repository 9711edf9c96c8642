"""A real PgBouncer (Debian's ``pgbouncer`` package) in transaction pooling mode, started on a
free port in front of the test database, and worker subprocesses whose every connection goes
through it. Skipped, saying why, when no pgbouncer binary can be found (``.ci/run`` installs it)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.shell.conftest import start_worker  # noqa: F401 - the worker subprocess fixture

PGBOUNCER = shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if Path(p).exists()), None)
# PgBouncer keeps prepared statements across pooled server connections from 1.21 on.
PREPARED_STATEMENTS_FROM = (1, 21)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pgbouncer_version() -> tuple[int, ...]:
    out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(part) for part in re.search(r"PgBouncer (\d+)\.(\d+)", out).groups())


@dataclass
class Bouncer:
    port: int
    version: tuple[int, ...]
    log_path: Path
    process: subprocess.Popen

    @property
    def prepared_statements(self) -> bool:
        return self.version >= PREPARED_STATEMENTS_FROM

    @property
    def options(self) -> dict:
        """BackWave's documented OPTIONS behind this PgBouncer (README, "Behind PgBouncer")."""
        return {} if self.prepared_statements else {"prepare_threshold": None}

    def show(self, what: str) -> list[dict]:
        """A SHOW command of PgBouncer's admin console (simple query protocol: psql)."""
        out = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "pgbouncer", "--csv", "-c", f"SHOW {what}"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
        ).stdout
        lines = out.strip().splitlines()
        header = lines[0].split(",")
        return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]

    def transactions(self, database: str) -> int:
        """Transactions PgBouncer has pooled for ``database`` since it started."""
        return sum(int(row["total_xact_count"]) for row in self.show("STATS") if row["database"] == database)

    def worker_env(self, *, hints_direct: bool = False) -> dict:
        return {"BACKWAVE_TEST_PGBOUNCER": json.dumps({"port": self.port, "options": self.options, "hints_direct": hints_direct})}


def _run_as(server_host: str) -> list[str]:
    """PgBouncer refuses to run as root: drop to an unprivileged user then. A server reached
    through a unix socket directory (the embedded server's, mode 0700) is reachable only by that
    directory's owner, so PgBouncer runs as the owner."""
    if os.geteuid() != 0:
        return []
    if server_host.startswith("/"):
        owner = Path(server_host).stat().st_uid
        if owner != 0:
            return ["-u", pwd.getpwuid(owner).pw_name]
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return ["-u", name]
        except KeyError:
            continue
    pytest.skip("pgbouncer refuses to run as root and there is no postgres or nobody user to run it as")


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup, django_db_blocker) -> Bouncer:
    """PgBouncer on a free port, transaction pooling, forwarding every database to the server the
    tests use; stopped after the module."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it when missing)")
    with django_db_blocker.unblock():
        server = connection.settings_dict
    version = pgbouncer_version()
    folder = Path(tempfile.mkdtemp(prefix="backwave-pgbouncer-"))
    port = free_port()
    target = " ".join(
        f"{key}={value}"
        for key, value in (
            ("host", server.get("HOST") or "127.0.0.1"),
            ("port", server.get("PORT") or 5432),
            ("user", server.get("USER") or "postgres"),
            ("password", server.get("PASSWORD")),
        )
        if value
    )
    settings = [
        "[databases]",
        f"* = {target}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {folder / 'users.txt'}",
        f"admin_users = {server.get('USER') or 'postgres'}",
        "pool_mode = transaction",
        "max_client_conn = 200",
        "default_pool_size = 8",  # fewer server connections than clients: sessions really are shared
        f"logfile = {folder / 'pgbouncer.log'}",
    ]
    if version >= PREPARED_STATEMENTS_FROM:
        settings.append("max_prepared_statements = 200")
    (folder / "pgbouncer.ini").write_text("\n".join(settings) + "\n")
    (folder / "users.txt").write_text(f'"{server.get("USER") or "postgres"}" ""\n')
    run_as = _run_as(server.get("HOST") or "")
    if run_as:
        user = pwd.getpwnam(run_as[1])
        for path in (folder, *folder.iterdir()):
            os.chown(path, user.pw_uid, user.pw_gid)
    process = subprocess.Popen(
        [PGBOUNCER, *run_as, str(folder / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    bouncer = Bouncer(port=port, version=version, log_path=folder / "pgbouncer.log", process=process)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                log = bouncer.log_path.read_text() if bouncer.log_path.exists() else ""
                process.kill()
                pytest.fail(f"pgbouncer did not start (exit code {process.poll()}):\n{log}")
            time.sleep(0.05)
    yield bouncer
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(folder, ignore_errors=True)

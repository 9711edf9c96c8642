"""The per-attempt scope: what Django's request cycle does around a view, done around a job.

Before the handler: drop connections that are unusable or past their maximum age
(``close_old_connections``, as Django does at a request's start; skipped on a thread whose last
attempt left it none). After it, whatever the handler
did: roll back a transaction it left open or broken and close the connection if it cannot be
trusted, then ``close_old_connections`` again. The next attempt on this thread starts clean.

A handler thread is not a web request, though. With Django's default ``CONN_MAX_AGE = 0`` a
request closes its connection when it ends; a worker doing that would open a new PostgreSQL
session for every job that touches the ORM (a fork of a backend per job, and a few hundred ORM
jobs a second at best). So a connection of an entry left at 0 lives for
``BACKWAVE["WORKER_CONN_MAX_AGE"]`` seconds on its thread instead, still closed at once when it
is unusable, in a broken transaction or past that age. An entry with a CONN_MAX_AGE of its own
keeps it, and one with Django's connection pool (``OPTIONS["pool"]``) is handed back to the pool
after every attempt, as Django does: the pool already makes that cheap.
"""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections, connections

logger = logging.getLogger("backwave.scope")

# Per handler thread: whether the last attempt left it holding a Django connection. Django's
# connections belong to their thread, and between two attempts a handler thread runs nothing
# that opens one, so a thread that left none has none to check when its next attempt starts.
_thread = threading.local()


def enter_attempt() -> None:
    """Call before the handler (plain functions, not a context manager: this is the hot path).
    The pass is skipped on a thread whose last attempt left no connection open: each
    ``connections.all`` is a thread-local look-up per alias, a fifth of a no-op attempt."""
    if getattr(_thread, "holds_none", False):
        return
    close_old_connections()


def leave_attempt() -> None:
    """Call after the handler, in a ``finally``. One pass over the thread's connections does
    what ``close_old_connections`` would do in a second one (each ``connections.all`` is a few
    thread-local look-ups, and this runs once per job)."""
    holds_none = True
    for connection in connections.all(initialized_only=True):
        _leave_clean(connection)
        _keep_for_the_thread(connection)
        connection.close_if_unusable_or_obsolete()
        holds_none = holds_none and connection.connection is None
    _thread.holds_none = holds_none


def _keep_for_the_thread(connection) -> None:
    """Give a connection opened under CONN_MAX_AGE = 0 the worker's maximum age instead.

    Django stamps ``close_at`` when it connects (connect time + CONN_MAX_AGE, so "now" for 0);
    moving it once per raw connection keeps the age counted from the connect.
    """
    raw = connection.connection
    if raw is None or connection.close_at is None or getattr(connection, "_backwave_kept", None) is raw:
        return
    settings_dict = connection.settings_dict
    if settings_dict.get("CONN_MAX_AGE") != 0 or (settings_dict.get("OPTIONS") or {}).get("pool"):
        return
    from backwave import conf

    connection._backwave_kept = raw
    connection.close_at += conf.get_setting("WORKER_CONN_MAX_AGE")


def _leave_clean(connection) -> None:
    left_open = connection.in_atomic_block or connection.needs_rollback
    try:
        left_open = left_open or (connection.connection is not None and not connection.get_autocommit())
    except Exception:
        left_open = True
    if not left_open:
        return
    logger.warning("A handler left a transaction open on %r; rolling it back", connection.alias)
    # The handler entered an atomic block it never left (or turned autocommit off): the only
    # safe move is to drop the connection, which makes PostgreSQL roll the transaction back.
    # connect() resets the rest of Django's transaction bookkeeping on the next use, once it no
    # longer believes it is inside an atomic block.
    try:
        connection.close()
    except Exception:
        logger.exception("Closing connection %r after a handler failed", connection.alias)
    connection.in_atomic_block = False
    connection.closed_in_transaction = False
    connection.connection = None

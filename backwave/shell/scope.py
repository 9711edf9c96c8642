"""The per-attempt scope: what Django's request cycle does around a view, done around a job.

Before the handler: drop connections that are unusable or past CONN_MAX_AGE
(``close_old_connections``, exactly as Django does at a request's start). After it, whatever the
handler did: roll back a transaction it left open or broken and close the connection if it cannot
be trusted, then ``close_old_connections`` again. The next attempt on this thread starts clean.
"""

from __future__ import annotations

import logging

from django.db import close_old_connections, connections

logger = logging.getLogger("backwave.scope")


def enter_attempt() -> None:
    """Call before the handler (plain functions, not a context manager: this is the hot path)."""
    close_old_connections()


def leave_attempt() -> None:
    """Call after the handler, in a ``finally``."""
    for connection in connections.all(initialized_only=True):
        _leave_clean(connection)
    close_old_connections()


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

"""The job table's cleanup session: PostgreSQL's side of ``backwave.shell.vacuum``.

A claim moves rows out of the claim index's front (backwave_job_claim, ready rows only), and
each leaves a dead index entry behind until the table is vacuumed. Every later claim walks them:
500 index pages after a 100,000-job drain, about a millisecond a claim. Autovacuum may be off (a
CI server) or far behind (by default it waits for a fifth of a table's rows to change), so a
worker vacuums the job table itself once enough has changed (see the shell's cleaner).

VACUUM cannot run in a transaction block, and it runs for as long as the table is large: it has
a session of its own, in autocommit, never a pump's (a pump stalled for the length of a vacuum
claims nothing and renews nothing meanwhile). Named ``backwave-vacuum`` in pg_stat_activity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from .postgres import store_error, worker_connect_params
from .queries import QUERIES

APPLICATION_NAME = "backwave-vacuum"


@dataclass(frozen=True, slots=True)
class TableChanges:
    """One reading of the job table's cumulative counters (see job_table_changes)."""

    changed: int  # row versions updated outside HOT or deleted, since the statistics began
    rows: float  # the table's rows as the planner counts them
    vacuums: int  # vacuums by anyone, autovacuum included


class JobTableVacuum:
    """One session that reads the job table's counters and vacuums it; opened again after a loss.
    One thread uses it; another may ``cancel()`` a vacuum in progress (a worker stopping)."""

    def __init__(self, connect_params: Mapping[str, Any]) -> None:
        self._connect_params = {**worker_connect_params(connect_params), "application_name": APPLICATION_NAME}
        self._conn: psycopg.Connection | None = None

    def changes(self) -> TableChanges | None:
        """The counters now; None when the job table is not there (not migrated yet)."""
        row = self._run("job_table_changes").fetchone()
        return None if row is None else TableChanges(changed=int(row[0]), rows=float(row[1]), vacuums=int(row[2]))

    def vacuum(self) -> None:
        """Vacuum the job table (skipped by the server when another session is vacuuming it)."""
        self._run("vacuum_backwave_job")

    def cancel(self) -> None:
        """End a vacuum in progress from another thread (it fails here as a StoreError)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                conn.cancel_safe(timeout=2.0)
            except psycopg.Error:
                pass  # the session is gone already: nothing runs to end

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _run(self, name: str) -> psycopg.Cursor:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(**self._connect_params, autocommit=True)
            return self._conn.execute(QUERIES[name])
        except psycopg.Error as exc:
            broken = self._conn is not None and self._conn.closed
            if broken:
                self._conn = None
            raise store_error(exc, f"{name}: {exc}", statement=name, connection_broken=broken) from exc

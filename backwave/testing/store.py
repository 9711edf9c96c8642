"""DjangoConnectionStore: the PostgreSQL store on Django's own connection, on a virtual clock.

Why a store of its own for tests. pytest-django's ``db`` fixture runs each test inside one
transaction on Django's connection; a PostgresStore has a connection of its own and would not
see a single row the test wrote. This store runs the very same statements (``queries.sql``,
through PostgresStore's own methods) on ``django.db.connections[alias]``, so it works inside a
test's transaction and in transactional tests alike.

Each operation runs inside ``transaction.atomic()``: in a test's transaction that is a
savepoint, so a failing statement is rolled back alone and the test's transaction stays usable,
which is what autocommit gives the production store. ``write_outcomes_then_claim`` runs its two
statements in one such block (one transaction, as the pipeline's), one after the other.

Time. Every ``now()`` in the statements becomes ``statement_timestamp() + offset``, the offset
read from a VirtualClock. ``statement_timestamp()``, not ``now()``: inside a test's transaction
``now()`` stays at the moment the test began, while the rows a test makes and the times it
computes (``timezone.now() + timedelta(...)``) are later; in autocommit the two are the same.
With no clock the offset is zero, and the SQL behaves as in production. The two statements of
``write_outcomes_then_claim`` share one reading, as they share one ``now()`` in PostgreSQL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import cache
from typing import Any

import psycopg
from django.db import DatabaseError, connections, transaction
from psycopg.types.json import JsonbLoader

from backwave.store.contract import NOTHING_OBSERVED, NewJob, StoreError, TransientStoreError
from backwave.store.enqueue import restore_caller_settings
from backwave.store.params import insert_statement_name, inserted_ids, run_enqueue
from backwave.store.postgres import PostgresStore, is_transient
from backwave.store.queries import QUERIES

from .clock import VirtualClock

_NOW = re.compile(r"\bnow\(\)", re.IGNORECASE)
_OFFSET = "backwave_clock_offset"
_FIXED_NOW = "backwave_now"


def clocked(sql: str, *, fixed: bool = False) -> str:
    """``sql`` with every ``now()`` read from the virtual clock: the statement's time moved by
    ``%(backwave_clock_offset)s``, or (``fixed``) the one time ``%(backwave_now)s``."""
    replacement = f"%({_FIXED_NOW})s::timestamptz" if fixed else f"(statement_timestamp() + %({_OFFSET})s::interval)"
    return _NOW.sub(replacement, sql)


@cache
def _statement(name: str, fixed: bool = False) -> str:
    return clocked(QUERIES[name], fixed=fixed)


class DjangoConnectionStore(PostgresStore):
    """The Storage Contract on ``connections[alias]``, the database clock moved by ``clock``."""

    def __init__(self, alias: str = "default", *, clock: VirtualClock | None = None, admitted_queues: Iterable[str] = ()) -> None:  # noqa: D107 - no super(): no connection of its own
        self.alias = alias
        self.clock = clock
        self.admitted_queues = frozenset(admitted_queues)
        # Operations, counted as PostgresStore counts its round-trips (one per operation that
        # reaches the server; write_outcomes_then_claim is one although Django cannot pipeline it).
        self.round_trips = 0
        self._closed = False
        self.observed = NOTHING_OBSERVED
        self._ancestors: dict[int, None] = {}  # as PostgresStore's

    @property
    def backend_pid(self) -> int:
        """Process id of the server backend behind Django's connection."""
        connection = connections[self.alias]
        connection.ensure_connection()
        return connection.connection.info.backend_pid

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[int]:
        """Insert jobs in one statement (no Wake-Up Hint); returns their ids in input order."""
        if not jobs:
            return []
        with self._cursor(insert_statement_name(jobs)) as cursor:

            def execute(name: str, params: dict) -> list[tuple]:
                cursor.execute(_statement(name), self._with_clock(params))
                return cursor.fetchall()

            name, rows = run_enqueue(execute, jobs, hint=False, observed=self.observed)
            # Inside atomic(): in a test's transaction the statement's SET LOCAL would outlive it.
            restore_caller_settings(cursor, name, rows)
        return inserted_ids(name, rows)

    def roll_up_task_stats(self, *, limit: int, settle: float = 0.0) -> int:
        """The rollup, not waiting for transactions open elsewhere on the server (settle 0 by
        default): in a test those are other tests', never writers of this database's attempts,
        and waiting for them would tie a virtual-time test to its neighbours' wall clock."""
        return super().roll_up_task_stats(limit=limit, settle=settle)

    def has_due_jobs(self, queues: Sequence[str]) -> bool:
        """Whether a ready job of ``queues`` (not paused) is due by the virtual clock: the test
        pump's check that a drain is finished; not part of the Storage Contract, not counted."""
        with self._cursor("has_due_jobs", count=False) as cursor:
            cursor.execute(_statement("has_due_jobs"), self._with_clock({"queues": list(queues)}))
            return cursor.fetchone()[0]

    def close(self) -> None:
        """Later calls raise StoreError; Django's connection is Django's to close."""
        self._closed = True

    # -- what PostgresStore's methods call ------------------------------------------------------

    def _execute(self, name: str, params: Mapping[str, Any]) -> list[tuple]:
        with self._cursor(name) as cursor:
            cursor.execute(_statement(name), self._with_clock(params))
            return cursor.fetchall() if cursor.description is not None else []

    def _pipeline(self, operation: str, statements: list[tuple[str, Mapping[str, Any]]]) -> list[list[tuple]]:
        """PostgresStore sends these down one pipeline; Django cannot pipeline, so they run one
        after another in one transaction, all at one now() (counted as one operation)."""
        running: str | None = None
        try:
            with self._cursor(operation) as cursor:
                cursor.execute(f"SELECT statement_timestamp() + %({_OFFSET})s::interval", self._with_clock({}))
                now = {_FIXED_NOW: cursor.fetchone()[0]}
                results = []
                for running, params in statements:
                    cursor.execute(_statement(running, fixed=True), {**params, **now})
                    results.append(cursor.fetchall() if cursor.description is not None else [])
                return results
        except StoreError as error:
            error.statement = running  # the statement refused, as PostgresStore's pipeline names it
            raise

    def _with_clock(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**params, _OFFSET: self.clock.offset if self.clock is not None else timedelta(0)}

    @contextmanager
    def _cursor(self, operation: str, *, count: bool = True):
        """One operation: a cursor inside atomic(), psycopg errors translated as PostgresStore does."""
        if self._closed:
            raise StoreError("this DjangoConnectionStore is closed; build a new one")
        connection = connections[self.alias]
        self.round_trips += count
        try:
            with transaction.atomic(using=self.alias), connection.cursor() as cursor:
                # Django loads jsonb as text (for JSONField); the store's rows carry decoded JSON.
                cursor.cursor.adapters.register_loader("jsonb", JsonbLoader)
                yield cursor
        except DatabaseError as error:
            cause = error.__cause__ if isinstance(error.__cause__, psycopg.Error) else None
            broken = connection.connection is None or connection.connection.closed
            transient = broken or (cause is not None and is_transient(cause))
            sqlstate = getattr(cause, "sqlstate", None)
            detail = f" [{sqlstate}]" if sqlstate else ""
            raise (TransientStoreError if transient else StoreError)(
                f"{operation} failed{detail}: {error}".strip(), sqlstate=sqlstate, statement=operation
            ) from error

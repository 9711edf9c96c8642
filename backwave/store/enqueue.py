"""The enqueue on a caller's cursor: the tasks backend runs it on Django's connection, inside the
caller's transaction, so a job commits (and its Wake-Up Hint goes out) with the caller's writes.
The statement is ``enqueue_many`` in queries.sql; its parameters come from ``params``."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.pq import TransactionStatus

from .contract import NOTHING_OBSERVED, Inserted, NewJob
from .params import inserted_from_rows, run_enqueue
from .queries import QUERIES


def insert_jobs(cursor, jobs: Sequence[NewJob], *, hint: bool = True) -> list[int]:
    """Insert ``jobs`` with one statement on ``cursor`` (psycopg or Django); ids in input order
    (a duplicate of a unique job: the existing job's id). ``hint`` also sends a Wake-Up Hint per
    queue, delivered when the transaction commits. Jobs with ancestors (``NewJob.after``) go in
    with their dependency rows, in the same one statement; DependencyRefused, with nothing
    written, for an ancestor that does not exist or already ended badly."""
    return [inserted.id for inserted in enqueue_jobs(cursor, jobs, hint=hint)]


def enqueue_jobs(cursor, jobs: Sequence[NewJob], *, hint: bool = True, observed: str = NOTHING_OBSERVED) -> list[Inserted]:
    """insert_jobs, saying for each job whether it was a duplicate and of what. ``observed``: the
    transitions observers watch, noted for a dependent its ancestor's end cancels at the commit."""
    if not jobs:
        return []

    def execute(name: str, params: dict) -> list[tuple]:
        cursor.execute(QUERIES[name], params)
        return cursor.fetchall()

    name, rows = run_enqueue(execute, jobs, hint=hint, observed=observed)
    restore_caller_settings(cursor, name, rows)
    return inserted_from_rows(name, rows)


def restore_caller_settings(cursor, name: str, rows: list[tuple]) -> None:
    """After an enqueue statement on ``cursor`` (psycopg or Django): enqueue_with_dependencies
    turns enable_seqscan off for the rest of the transaction, so that its foreign keys' checks
    are planned as index scans; inside a caller's transaction, the caller's value goes back
    before the caller's next statement (also when the statement refused the batch). In
    autocommit, the statement's transaction has ended, and the setting with it."""
    if name == "enqueue_with_dependencies":
        restore_enable_seqscan(cursor, rows[0][3])


def restore_enable_seqscan(cursor, callers: str) -> None:
    """After a statement that turned enable_seqscan off for its own foreign-key lookups (and
    returned the value it found, ``callers``): inside a caller's transaction, that value back
    before the caller's next statement. In autocommit the statement's transaction has ended,
    and the setting with it."""
    if cursor.connection.info.transaction_status != TransactionStatus.IDLE:
        cursor.execute(QUERIES["restore_enable_seqscan"], {"enable_seqscan": callers})

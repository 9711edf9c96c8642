"""The enqueue on a caller's cursor: the tasks backend runs it on Django's connection, inside the
caller's transaction, so a job commits (and its Wake-Up Hint goes out) with the caller's writes.
The statement is ``enqueue_many`` in queries.sql; its parameters come from ``params``."""

from __future__ import annotations

from collections.abc import Sequence

from .contract import NewJob
from .params import insert_statement, inserted_ids
from .queries import QUERIES


def insert_jobs(cursor, jobs: Sequence[NewJob], *, hint: bool = True) -> list[int]:
    """Insert ``jobs`` with one statement on ``cursor`` (psycopg or Django); ids in input order.
    ``hint`` also sends a Wake-Up Hint per queue, delivered when the transaction commits.
    Jobs with ancestors (``NewJob.after``) go in with their dependency rows, in the same one
    statement; DependencyRefused, with nothing written, for an ancestor that does not exist or
    already ended badly."""
    if not jobs:
        return []
    name, params = insert_statement(jobs, hint=hint)
    cursor.execute(QUERIES[name], params)
    return inserted_ids(name, cursor.fetchall())

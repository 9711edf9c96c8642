"""The enqueue on a caller's cursor: the tasks backend runs it on Django's connection, inside the
caller's transaction, so a job commits (and its Wake-Up Hint goes out) with the caller's writes.
The statement is ``enqueue_many`` in queries.sql; its parameters come from ``params``."""

from __future__ import annotations

from collections.abc import Sequence

from .contract import NewJob
from .params import insert_jobs_params
from .queries import QUERIES


def insert_jobs(cursor, jobs: Sequence[NewJob], *, hint: bool = True) -> list[int]:
    """Insert ``jobs`` with one statement on ``cursor`` (psycopg or Django); ids in input order.
    ``hint`` also sends a Wake-Up Hint per queue, delivered when the transaction commits."""
    if not jobs:
        return []
    cursor.execute(QUERIES["enqueue_many"], insert_jobs_params(jobs, hint=hint))
    return [row[0] for row in cursor.fetchall()]

"""The enqueue statement, shared by the tasks backend (on Django's connection, inside the
caller's transaction) and the PostgreSQL store (on its own connection)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .contract import NewJob

# One statement for any number of jobs, with one parameter: the batch travels as a JSON array
# that jsonb_to_recordset() turns into rows. The parameter count stays at one however many jobs
# there are (a multi-row VALUES list hits PostgreSQL's 65,535-parameter limit at a few thousand
# jobs), and encoding the batch is one C call (json.dumps) instead of ten Python-built arrays.
# WITH ORDINALITY plus the ORDER BY keeps ids in input order. A NULL run_at means "due now"
# by the database clock.
INSERT_JOBS_SQL = """
INSERT INTO backwave_job (
    task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
    backend, tags, state, attempts, enqueued_at, worker_id
)
SELECT n.task_path, n.payload, n.queue, n.priority, coalesce(n.run_at, now()), n.max_attempts,
       n.backoff_base, n.backoff_max, n.backend,
       coalesce(n.tags, '{}'::varchar[]),
       'ready', 0, now(), ''
FROM ROWS FROM (
         jsonb_to_recordset(%s::jsonb)
         AS (task_path text, payload jsonb, queue text, priority smallint, run_at timestamptz,
             max_attempts int, backoff_base float8, backoff_max float8, backend text, tags varchar[])
     ) WITH ORDINALITY
     AS n(task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
          backend, tags, position)
ORDER BY n.position
RETURNING id
"""


# The same insert, plus one Wake-Up Hint per distinct queue: pg_notify() inside the enqueuing
# transaction goes out only on commit (a rolled-back enqueue wakes nobody), and PostgreSQL folds
# identical notifications of one transaction into one, so a bulk enqueue sends one per queue.
# A SELECT-only CTE runs only when referenced, hence the cross join with its one-row count. Ids
# come from the sequence in insertion order, which follows the ORDER BY, so ORDER BY id gives
# input order.
INSERT_JOBS_AND_HINT_SQL = (
    "WITH inserted AS ("
    + INSERT_JOBS_SQL.strip().removesuffix("RETURNING id").rstrip()
    + """
    RETURNING id, queue
), hinted AS (
    SELECT count(pg_notify('backwave_hint', q.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM inserted) AS q
)
SELECT inserted.id FROM inserted CROSS JOIN hinted ORDER BY inserted.id
"""
)


def insert_jobs_params(jobs: Sequence[NewJob]) -> list[str]:
    """The one parameter of INSERT_JOBS_SQL: the jobs as a JSON array of objects."""
    rows = [
        {
            "task_path": job.task_path,
            "payload": job.payload,
            "queue": job.queue,
            "priority": job.priority,
            "run_at": job.run_at.isoformat() if job.run_at is not None else None,
            "max_attempts": job.max_attempts,
            "backoff_base": float(job.backoff_base),
            "backoff_max": float(job.backoff_max),
            "backend": job.backend,
            "tags": list(job.tags),
        }
        for job in jobs
    ]
    return [json.dumps(rows)]


def insert_jobs(cursor, jobs: Sequence[NewJob], *, hint: bool = True) -> list[int]:
    """Insert ``jobs`` with one statement on ``cursor`` (psycopg or Django); ids in input order.
    ``hint`` also sends a Wake-Up Hint per queue, delivered when the transaction commits."""
    if not jobs:
        return []
    cursor.execute(INSERT_JOBS_AND_HINT_SQL if hint else INSERT_JOBS_SQL, insert_jobs_params(jobs))
    return [row[0] for row in cursor.fetchall()]

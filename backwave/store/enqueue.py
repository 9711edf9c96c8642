"""The enqueue statement, shared by the tasks backend (on Django's connection, inside the
caller's transaction) and the PostgreSQL store (on its own connection)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .contract import NewJob

# One statement for any number of jobs: columns travel as arrays and unnest() turns them into
# rows, so the parameter count stays at ten however many jobs there are (a multi-row VALUES list
# would hit PostgreSQL's 65,535-parameter limit at a few thousand jobs). WITH ORDINALITY plus the
# ORDER BY keeps ids in input order. A NULL run_at means "due now" by the database clock.
INSERT_JOBS_SQL = """
INSERT INTO backwave_job (
    task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
    backend, tags, state, attempts, enqueued_at, worker_id
)
SELECT n.task_path, n.payload, n.queue, n.priority, coalesce(n.run_at, now()), n.max_attempts,
       n.backoff_base, n.backoff_max, n.backend,
       coalesce(ARRAY(SELECT jsonb_array_elements_text(n.tags)), '{}'::varchar[]),
       'ready', 0, now(), ''
FROM unnest(
    %s::text[], %s::jsonb[], %s::text[], %s::smallint[], %s::timestamptz[], %s::int[],
    %s::float8[], %s::float8[], %s::text[], %s::jsonb[]
) WITH ORDINALITY AS n(task_path, payload, queue, priority, run_at, max_attempts,
                       backoff_base, backoff_max, backend, tags, position)
ORDER BY n.position
RETURNING id
"""


def insert_jobs_params(jobs: Sequence[NewJob]) -> list[list]:
    """The ten array parameters of INSERT_JOBS_SQL, column by column."""
    return [
        [job.task_path for job in jobs],
        [json.dumps(job.payload) for job in jobs],
        [job.queue for job in jobs],
        [job.priority for job in jobs],
        [job.run_at for job in jobs],
        [job.max_attempts for job in jobs],
        [float(job.backoff_base) for job in jobs],
        [float(job.backoff_max) for job in jobs],
        [job.backend for job in jobs],
        [json.dumps(list(job.tags)) for job in jobs],
    ]


def insert_jobs(cursor, jobs: Sequence[NewJob]) -> list[int]:
    """Insert ``jobs`` with one statement on ``cursor`` (psycopg or Django); ids in input order."""
    if not jobs:
        return []
    cursor.execute(INSERT_JOBS_SQL, insert_jobs_params(jobs))
    return [row[0] for row in cursor.fetchall()]

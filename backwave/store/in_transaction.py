"""An atomic task's outcome, written on the handler's connection inside its transaction.

The statement is ``write_outcomes_many`` itself, fence and all (this lease, live, the job still
running at this attempt), with every ``now()`` read as ``statement_timestamp()``: inside the
handler's transaction ``now()`` is the moment the transaction began, before the handler ran,
and the fence must judge the lease as it is when the outcome is written. The rows it locks (the
lease FOR KEY SHARE, the job) stay locked until the caller's transaction ends, so expiry cannot
release the job between this write and that commit.

An outcome that ends its job is preceded by ``lock_outcome_jobs`` (its own statement, so that
the outcome statement's snapshot, taken after the lock was granted, sees a dependent whose
enqueue committed meanwhile: see lock_outcome_jobs in queries.sql).
"""

from __future__ import annotations

import re
import uuid

import psycopg

from .contract import Applied, OutcomeRecord
from .params import applied_from_rows, lock_params, outcome_batch
from .queries import QUERIES, native_statement

_STATEMENT = re.sub(r"\bnow\(\)", "statement_timestamp()", QUERIES["write_outcomes_many"], flags=re.IGNORECASE)
_LOCK = re.sub(r"\bnow\(\)", "statement_timestamp()", QUERIES["lock_outcome_jobs"], flags=re.IGNORECASE)
# Sent with native placeholders (see native_statement): psycopg would parse the outcome
# statement's 7,500 bytes afresh on every atomic job.
_STATEMENT_TEXT, _STATEMENT_NAMES = native_statement(_STATEMENT)
_LOCK_TEXT, _LOCK_NAMES = native_statement(_LOCK)


def write_outcome(connection, *, lease_id: uuid.UUID, record: OutcomeRecord, observed: str) -> Applied:
    """Write one fenced outcome with one statement on ``connection`` (the psycopg connection
    under Django's, inside its transaction); the ids applied (none when the fence refused it). A
    record that cannot be encoded comes back in ``Applied.replaced``.

    Prepared (``prepare=True``), with server-side binding: a handler thread sends this statement
    once per atomic job, and planning its CTEs every time would cost more than running them."""
    params, replaced = outcome_batch(lease_id, [record])
    params["observed"] = observed
    # A plain (server-side binding) cursor: Django makes its own cursors client-side binding,
    # which cannot prepare.
    with psycopg.RawCursor(connection) as cursor:
        if (lock := lock_params(lease_id, [record])) is not None:
            cursor.execute(_LOCK_TEXT, [lock[name] for name in _LOCK_NAMES], prepare=True)
        rows = cursor.execute(_STATEMENT_TEXT, [params[name] for name in _STATEMENT_NAMES], prepare=True).fetchall()
    return applied_from_rows(rows, replaced)

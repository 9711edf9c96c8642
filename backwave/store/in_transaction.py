"""An atomic task's outcome, written on the handler's connection inside its transaction.

The statement is ``write_outcomes_many`` itself, fence and all (this lease, live, the job still
running at this attempt), with every ``now()`` read as ``statement_timestamp()``: inside the
handler's transaction ``now()`` is the moment the transaction began, before the handler ran,
and the fence must judge the lease as it is when the outcome is written. The rows it locks (the
lease FOR KEY SHARE, the job) stay locked until the caller's transaction ends, so expiry cannot
release the job between this write and that commit.

A job that had no dependents when it was claimed is written by ``write_outcomes_plain``, as
the batch path writes it (no lock, no settling); should a dependent have been enqueued while it
ran (the plain write's fence then leaves it), the settling write follows, in the same
transaction. The settling write is preceded by ``lock_outcome_jobs`` (its own statement, so
that the outcome statement's snapshot, taken after the lock was granted, sees a dependent whose
enqueue committed meanwhile: see lock_outcome_jobs in queries.sql).

Before them, the worker's own planner settings (``set_transaction_settings``: generic plans,
no JIT, no sequential scan where an index serves), which the handler's Django connection does
not have. Django turns prepared statements off by default (``prepare_threshold`` unset in the
database's OPTIONS), and then each of these statements is parsed and planned on every atomic
job; prepared, PostgreSQL would still plan a session's first five runs afresh unless told to
keep a generic plan. The one-row settling write, planned afresh, cost more than running it (1.6
ms a job against 0.6 ms for a batch write of 16). The settings are SET LOCAL, set once the
handler has returned: they last until the handler's transaction commits, and only this
module's statements run in it by then.
"""

from __future__ import annotations

import re
import uuid

import psycopg

from .contract import Applied, OutcomeRecord
from .params import applied_from_rows, lock_params, outcome_batch
from .queries import QUERIES, native_statement

def _statement(name: str) -> tuple[bytes, tuple[str, ...]]:
    """The named statement with every now() read as statement_timestamp(), in native
    placeholders (see native_statement): psycopg would parse the outcome statements' 7,500
    bytes afresh on every atomic job."""
    return native_statement(re.sub(r"\bnow\(\)", "statement_timestamp()", QUERIES[name], flags=re.IGNORECASE))


_SETTLING = _statement("write_outcomes_many")
_PLAIN = _statement("write_outcomes_plain")
_LOCK = _statement("lock_outcome_jobs")
_SETTINGS = native_statement(QUERIES["set_transaction_settings"])
# None leaves the session's timeouts and commit mode as the application set them.
_SETTINGS_VALUES = {"statement_timeout": None, "lock_timeout": None, "synchronous_commit": None}


def write_outcome(connection, *, lease_id: uuid.UUID, record: OutcomeRecord, observed: str, plain: bool = False) -> Applied:
    """Write one fenced outcome on ``connection`` (the psycopg connection under Django's, inside
    its transaction); the ids applied (none when the fence refused it). A record that cannot be
    encoded comes back in ``Applied.replaced``. ``plain``: the job had no dependents when it was
    claimed (the write is then the plain one, and the settling one only if it left the outcome).

    Sent with server-side binding and ``prepare=True``, which prepares them when the connection
    allows it (``prepare_threshold`` set; Django's default turns preparation off): a handler
    thread sends these statements once per atomic job, and planning their CTEs every time costs
    more than running them."""
    params, replaced = outcome_batch(lease_id, [record])
    params["observed"] = observed
    # A plain (server-side binding) cursor: Django makes its own cursors client-side binding,
    # which cannot prepare.
    with psycopg.RawCursor(connection) as cursor:
        _execute(cursor, _SETTINGS, _SETTINGS_VALUES)
        if plain:
            applied = applied_from_rows(_execute(cursor, _PLAIN, params).fetchall(), replaced)
            if record.job_id in applied:
                return applied
            # Given a dependent while it ran, or refused by the fence (refused again below).
        if (lock := lock_params(lease_id, [record])) is not None:
            _execute(cursor, _LOCK, lock)
        return applied_from_rows(_execute(cursor, _SETTLING, params).fetchall(), replaced)


def _execute(cursor, statement: tuple[bytes, tuple[str, ...]], params: dict):
    text, names = statement
    return cursor.execute(text, [params[name] for name in names], prepare=True)

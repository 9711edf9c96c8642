"""An atomic task's outcome, written on the handler's connection inside its transaction.

The statement is ``write_outcomes_many`` itself, fence and all (this lease, live, the job still
running at this attempt), with every ``now()`` read as ``statement_timestamp()``: inside the
handler's transaction ``now()`` is the moment the transaction began, before the handler ran,
and the fence must judge the lease as it is when the outcome is written. The rows it locks (the
lease FOR KEY SHARE, the job) stay locked until the caller's transaction ends, so expiry cannot
release the job between this write and that commit.

A job that had no dependents when it was claimed is written by ``write_outcomes_plain``, as
the batch path writes it (no settling); should a dependent have been enqueued while it ran (the
plain write's fence then leaves it), the settling write follows, in the same transaction. The
outcome statements pass over a job row another transaction holds ("busy"), which the batch path
writes again later; the handler's transaction cannot wait for a later write, so here the
settling write is preceded by ``lock_outcome_jobs``, which waits for such a holder (on this
handler's thread alone, never the pump's), and the statement after it, its snapshot taken once
the lock was granted, sees what the holder committed (a dependent enqueued after= the job).

Before them, the worker's own planner settings (``set_transaction_settings``: generic plans,
no JIT, no sequential scan where an index serves), which the handler's Django connection does
not have. The settings are SET LOCAL, set once the handler has returned: they last until the
handler's transaction commits, and only this module's statements run in it by then.

These statements are prepared on the handler's connection, once per connection, even though
Django turns prepared statements off by default (it sets ``prepare_threshold`` to None unless
``OPTIONS`` names one): the worker's own store prepares its statements under that same default,
and the rule is the same here (``prepares_atomic_writes``). Parsed and planned afresh on every
atomic job, the outcome statement's CTEs cost more to plan than to run (about 1 ms of planning a
job). The connection's ``prepare_threshold`` is lifted only for these statements and put back,
so the application's own queries on that connection stay unprepared. A project whose ``OPTIONS``
set ``prepare_threshold`` (None behind a PgBouncer before 1.21) is followed as it is: None
prepares nothing, a number lets psycopg prepare them as it prepares everything else.
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


def prepares_atomic_writes(settings_dict: dict) -> bool:
    """Whether atomic writes on connections to this ``DATABASES`` entry are prepared although
    Django's connection has preparation off: when its ``OPTIONS`` leave ``prepare_threshold``
    unset, as the worker's store decides for its own connection (PostgresStore: the OPTIONS'
    value wins, and without one it prepares)."""
    return "prepare_threshold" not in (settings_dict.get("OPTIONS") or {})


def write_outcome(
    connection, *, lease_id: uuid.UUID, record: OutcomeRecord, observed: str, plain: bool = False, prepare: bool = False
) -> Applied:
    """Write one fenced outcome on ``connection`` (the psycopg connection under Django's, inside
    its transaction); the ids applied (none when the fence refused it). A record that cannot be
    encoded comes back in ``Applied.replaced``. ``plain``: the job had no dependents when it was
    claimed (the write is then the plain one, and the settling one only if it left the outcome).
    ``prepare``: prepare the statements even when the connection's ``prepare_threshold`` is None
    (see prepares_atomic_writes), which is put back afterwards."""
    params, replaced = outcome_batch(lease_id, [record])
    params["observed"] = observed
    if not prepare or connection.prepare_threshold is not None:
        return _write(connection, lease_id, record, params, replaced, plain)
    # Lifted for these statements alone: psycopg prepares a statement with prepare=True only
    # while the threshold is not None, and keeps its name (reused the next time it is lifted;
    # dropped, with every other, when the connection rolls a transaction back).
    connection.prepare_threshold = 0
    try:
        return _write(connection, lease_id, record, params, replaced, plain)
    finally:
        connection.prepare_threshold = None


def _write(connection, lease_id: uuid.UUID, record: OutcomeRecord, params: dict, replaced: dict, plain: bool) -> Applied:
    # A plain (server-side binding) cursor: Django makes its own cursors client-side binding,
    # which cannot prepare.
    with psycopg.RawCursor(connection) as cursor:
        _execute(cursor, _SETTINGS, _SETTINGS_VALUES)
        if plain:
            applied = applied_from_rows(_execute(cursor, _PLAIN, params).fetchall(), replaced)
            if record.job_id in applied:
                return applied
            # Given a dependent while it ran, held by another transaction, or refused by the fence
            # (refused again below).
        _execute(cursor, _LOCK, lock_params(lease_id, [record]))
        return applied_from_rows(_execute(cursor, _SETTLING, params).fetchall(), replaced)


def _execute(cursor, statement: tuple[bytes, tuple[str, ...]], params: dict):
    text, names = statement
    return cursor.execute(text, [params[name] for name in names], prepare=True)

"""PostgresStore: the Storage Contract on PostgreSQL, one SQL statement per operation.

Theory of operation. A store owns one psycopg connection in autocommit mode, so every call is
its own transaction and no lock outlives the call that took it. Each operation is a single
hand-written statement from ``queries.sql`` (one network round-trip, counted in ``round_trips``);
the claims add the lock of limited queues, and ``write_outcomes_then_claim`` the claim, in the
same round-trip. Hot statements become server-side prepared after ``prepare_threshold`` uses.

Per-transaction settings. The statement and lock timeouts (and synchronous_commit off, when
asked for) are set by ``set_transaction_settings`` at the head of every round-trip: it goes down
the same pipeline as the operation's statements, in the same implicit transaction (one Sync), so
it costs no round-trip of its own. ``is_local`` makes it SET LOCAL: nothing is sent at connect
(a startup ``options`` parameter is refused by a transaction-pooling PgBouncer) and nothing
outlives the transaction (a session-level SET would stay on a pooled server connection and leak
to the next client). A user's session-level values (``OPTIONS["options"]``) stay for the session;
inside the store's own transactions BackWave's win.

Bounded waits. A stuck lock or a slow statement ends in SQLSTATE 55P03 or 57014 within the
timeouts; a silent network (a partition, a host gone without a FIN) ends in a connection error
through TCP keepalives and ``tcp_user_timeout``: a transient fault within seconds, never a pump
blocked for the kernel's quarter of an hour while its health says it is fine.

Every timestamp is the database's ``now()``: the host clock is never sent, so clock skew between
worker hosts cannot stretch or shorten a lease.

Failures surface as ``TransientStoreError`` (connection lost, server restarting, serialization
failure, deadlock, lock or statement timeout: retry on a later tick) or ``StoreError``
(anything else). A connection that broke is dropped, and the next call opens a fresh one. A
connection the server refuses for good (no such database or role, failed authentication, a
startup option it rejects) is a ``StoreError``: retrying it would change nothing.

A store is used by one thread at a time (each pump owns its own).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from backwave import taskstats
from backwave.core.jobs import ClaimedJob
from backwave.core.options import store_timeouts

from .contract import (
    ANALYZED_TABLES,
    NOTHING_OBSERVED,
    ROLLUP_SETTLE,
    STALE_STATISTICS,
    Applied,
    DeliveryResult,
    DueSchedule,
    Heartbeat,
    NewJob,
    OutcomeRecord,
    ProgressReport,
    PumpHealth,
    Released,
    ScheduleDefinition,
    ScheduleSlot,
    StoreError,
    TransientStoreError,
    TransitionRecord,
)
from .params import (
    applied_from_rows,
    claim_statement,
    delivery_params,
    heartbeat_from_row,
    heartbeat_params,
    inserted_ids,
    is_refused_heartbeat,
    known_params,
    lease_seconds,
    outcome_batch,
    run_enqueue,
    transition_record,
    write_isolating,
    write_then_claim,
)
from .queries import QUERIES, native_statement
from .storable import clean_text

DEFAULT_APPLICATION_NAME = "backwave"
DEFAULT_CONNECT_TIMEOUT = 10  # seconds (libpq's connect_timeout)

# libpq's TCP keepalives, for every long-lived worker connection (the store's, the hint
# listener's). The kernel's defaults wait two hours before a first probe of a silent connection,
# and retransmit unacknowledged data for about fifteen minutes. With these a dead peer is noticed
# after about 11 s (5 s of silence, then probes 2 s apart): the call in progress fails with a
# connection error, a transient fault, and the next call reconnects. tcp_user_timeout (ms; libpq
# 12 and later, Linux) bounds unacknowledged sends, and keepalive probes, to 10 s. Keys set in
# DATABASES OPTIONS (or a conninfo) win. All of them are ignored on a Unix-domain socket.
DEFAULT_KEEPALIVES: dict[str, int] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}
DEFAULT_TCP_USER_TIMEOUT_MS = 10_000
_LIBPQ_HAS_TCP_USER_TIMEOUT = psycopg.pq.version() >= 120000

# Prepared on the second use: the claim, the outcome write and the heartbeat run thousands of
# times per connection, so parsing and planning them once pays off at once. Pass None behind a
# pooler that cannot keep prepared statements (PgBouncer in transaction mode before 1.21).
DEFAULT_PREPARE_THRESHOLD = 1

# A store built outside a worker (which derives them from its groups' leases) gets the timeouts
# of the default lease: 6 s for a statement, 2 s for a lock wait.
DEFAULT_STORE_TIMEOUTS = store_timeouts(())

# Claimed jobs with dependents a store remembers until their outcome (see PostgresStore._ancestors).
_ANCESTORS_KEPT = 10_000

# SQLSTATEs worth a retry on a later tick; class 08 (connection exception) and class 53
# (insufficient resources: too many connections, out of memory) are transient as a whole.
TRANSIENT_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available (lock_timeout)
        "57014",  # query_canceled (statement_timeout)
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, shutting down, in recovery)
    }
)
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "53"})

# A connection attempt the server refuses gives psycopg no SQLSTATE (libpq hands back the
# server's FATAL as text only), so these are matched on PostgreSQL's own messages for the
# refusals that no retry can cure, each with the SQLSTATE the server sent. Everything else at
# connect time (refused, timed out, reset, starting up, shutting down, in recovery, too many
# clients) is worth a retry. The server words these in its lc_messages language: with another
# language they read as transient, and the health check of a pump no call has answered for a
# lease still reports it (503).
PERMANENT_CONNECT_REFUSALS = tuple(
    (sqlstate, re.compile(pattern))
    for sqlstate, pattern in (
        ("3D000", r'database ".*" does not exist'),
        ("28000", r'role ".*" does not exist'),
        ("28000", r'role ".*" is not permitted to log in'),
        ("28P01", r"password authentication failed for user"),
        ("28000", r"\w+ authentication failed for user"),  # peer, ident, ldap, cert, radius ...
        ("28000", r"no pg_hba\.conf entry for"),
        ("28000", r"pg_hba\.conf rejects connection"),
        ("28000", r"fe_sendauth: no password supplied"),  # the server asked for one; none is set
        ("42501", r"permission denied for database"),
        ("42501", r"permission denied to set parameter"),
        ("55000", r'database ".*" is not currently accepting connections'),
        ("42704", r"unrecognized configuration parameter"),
        ("22023", r"invalid value for parameter"),
        ("55P02", r"cannot be changed without restarting the server"),
    )
)

# Keys of a Django DATABASES OPTIONS dict that configure Django's wrapper, not libpq.
_DJANGO_ONLY_OPTIONS = frozenset({"pool", "server_side_binding", "isolation_level", "assume_role", "cursor_factory", "context"})


def is_transient(exc: psycopg.Error, *, connection_broken: bool = False) -> bool:
    """Whether ``exc`` is worth retrying on a later tick rather than halting the pump."""
    if connection_broken:
        return True
    sqlstate = exc.sqlstate
    if sqlstate is None:
        # Raised by the client, not the server: refused, lost or timed-out connections, unless
        # it carries a refusal of the server's that no retry cures.
        return isinstance(exc, psycopg.OperationalError) and connect_refusal(str(exc)) is None
    return sqlstate in TRANSIENT_SQLSTATES or sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES


def store_error(exc: psycopg.Error, message: str, *, statement: str, connection_broken: bool = False) -> StoreError:
    """``exc`` as the store's error: TransientStoreError when a retry may cure it (see
    ``is_transient``), carrying the server's SQLSTATE and the name of the statement refused."""
    kind = TransientStoreError if is_transient(exc, connection_broken=connection_broken) else StoreError
    return kind(message, sqlstate=exc.sqlstate, statement=statement)


def connect_refusal(message: str) -> str | None:
    """The SQLSTATE of a connect-time refusal no retry cures, read from its message; else None."""
    for sqlstate, pattern in PERMANENT_CONNECT_REFUSALS:
        if pattern.search(message):
            return sqlstate
    return None


def worker_connect_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` plus the connect timeout and TCP keepalives of a worker's long-lived
    connections (see DEFAULT_KEEPALIVES); a key ``params`` already has keeps its value."""
    result = dict(params)
    # A host that does not answer (a network partition, not a refused connection) must not
    # hold the caller in connect() for ever: it reports a transient fault and retries.
    result.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    for keyword, value in DEFAULT_KEEPALIVES.items():
        result.setdefault(keyword, value)
    if _LIBPQ_HAS_TCP_USER_TIMEOUT:
        result.setdefault("tcp_user_timeout", DEFAULT_TCP_USER_TIMEOUT_MS)
    return result


def django_conninfo(settings_dict: Mapping[str, Any]) -> dict[str, Any]:
    """psycopg connection keywords for a Django ``DATABASES`` entry (PostgreSQL only)."""
    engine = settings_dict.get("ENGINE", "")
    if "postgresql" not in engine:
        raise StoreError(f"BackWave needs a PostgreSQL database; this DATABASES entry uses ENGINE={engine!r}.")
    options = {k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if k not in _DJANGO_ONLY_OPTIONS}
    params: dict[str, Any] = {"dbname": settings_dict.get("NAME") or "postgres", **options}
    for setting, keyword in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host"), ("PORT", "port")):
        if settings_dict.get(setting):
            params[keyword] = str(settings_dict[setting])  # HOST may be a unix socket directory
    return params


class PostgresStore:
    """The Storage Contract on PostgreSQL, over one autocommit psycopg connection."""

    def __init__(
        self,
        conninfo: str | Mapping[str, Any],
        *,
        prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
        application_name: str = DEFAULT_APPLICATION_NAME,
        synchronous_commit: bool = True,
        statement_timeout: float | None = DEFAULT_STORE_TIMEOUTS.statement,
        lock_timeout: float | None = DEFAULT_STORE_TIMEOUTS.lock,
        admitted_queues: Iterable[str] = (),
    ) -> None:
        """``synchronous_commit`` False commits the store's transactions without waiting for
        the WAL flush (see BACKWAVE["WORKER_SYNCHRONOUS_COMMIT"]); True leaves the database's
        setting. The timeouts are seconds; None leaves the session's value (no limit, unless
        the server or the connection's options set one). ``admitted_queues``: the queues under a
        per-key concurrency or rate limit (BACKWAVE["QUEUES"]), claimed by claim_jobs_admitted."""
        self.admitted_queues = frozenset(admitted_queues)
        settings = {
            "statement_timeout": _milliseconds("statement_timeout", statement_timeout),
            "lock_timeout": _milliseconds("lock_timeout", lock_timeout),
            "synchronous_commit": None if synchronous_commit else "off",
        }
        # The head of every round-trip (see the module docstring), or None when nothing is set.
        self._transaction_settings: tuple[str, dict[str, str | None]] | None = (
            (QUERIES["set_transaction_settings"], settings) if any(value is not None for value in settings.values()) else None
        )
        params = worker_connect_params(conninfo_to_dict(conninfo) if isinstance(conninfo, str) else conninfo)
        params.setdefault("application_name", application_name)
        params.setdefault("prepare_threshold", prepare_threshold)
        params["autocommit"] = True
        self._connect_params = params
        self._conn: psycopg.Connection | None = None
        # The cursors a round-trip's statements run on, the n-th statement on the n-th, kept for
        # the life of the connection they were made on (see _cursors_for).
        self._cursors: list[psycopg.RawCursor] = []
        self._cursors_of: psycopg.Connection | None = None
        self._closed = False
        # The server process of the current connection, set on each connect: read from other
        # threads (the hint listener), so a plain attribute, never the connection itself.
        self.session_pid: int | None = None
        # Which transitions the outcome statements note for observers (see the Storage Contract).
        self.observed = NOTHING_OBSERVED
        # The claimed jobs that had dependents when claimed, oldest first (a dict as an ordered
        # set): their outcome goes behind lock_outcome_jobs and settles them; any other job's
        # goes through write_outcomes_plain. Changed by whichever thread makes the pump's store
        # call (its own, or its store thread while it waits) and read by the pump thread when it
        # starts an atomic job, maybe during a claim: a single membership test, safe under the
        # GIL, of a job claimed before. Only a hint: a job missing here (dropped past the bound,
        # or given a dependent while it ran) is refused by the plain write's fence and written by
        # the settling one after it.
        self._ancestors: dict[int, None] = {}
        # Network round-trips of store operations, one per call that reaches the server. Not
        # counted: connecting, and the one extra exchange psycopg spends preparing each
        # statement the first time it is prepared on a connection.
        self.round_trips = 0
        self._connection()

    @classmethod
    def from_django(cls, alias: str = "default", **kwargs: Any) -> PostgresStore:
        """A store on the database of ``settings.DATABASES[alias]``, with a connection of its own.

        Settings not passed come from BACKWAVE: WORKER_SYNCHRONOUS_COMMIT, and the timeouts
        WORKER_STATEMENT_TIMEOUT and WORKER_LOCK_TIMEOUT, a None there derived from the default
        lease (the worker passes the values it derived from its groups' leases)."""
        from django.conf import settings

        from backwave import conf

        kwargs.setdefault("synchronous_commit", conf.get_setting("WORKER_SYNCHRONOUS_COMMIT"))
        kwargs.setdefault("admitted_queues", conf.admitted_queue_names())
        if "statement_timeout" not in kwargs or "lock_timeout" not in kwargs:
            timeouts = store_timeouts(
                (),
                statement_timeout=conf.get_setting("WORKER_STATEMENT_TIMEOUT"),
                lock_timeout=conf.get_setting("WORKER_LOCK_TIMEOUT"),
            )
            kwargs.setdefault("statement_timeout", timeouts.statement)
            kwargs.setdefault("lock_timeout", timeouts.lock)
        return cls(django_conninfo(settings.DATABASES[alias]), **kwargs)

    # -- leases --------------------------------------------------------------------------------

    def open_lease(self, *, lease_id: uuid.UUID, worker_id: str, group: str, hostname: str, pid: int, duration: float) -> None:
        """Create the pump's lease, expiring ``duration`` seconds from now by the database clock."""
        params = {
            "lease_id": lease_id,
            "worker_id": worker_id,
            "group": group,
            "hostname": hostname,
            "pid": pid,
            "duration": lease_seconds(duration),
        }
        self._execute("open_lease", params)

    def renew_lease(self, *, lease_id: uuid.UUID, duration: float) -> bool:
        """Push the lease's expiry to now + duration. False when it is gone or already lapsed."""
        return bool(self._execute("renew_lease", {"lease_id": lease_id, "duration": lease_seconds(duration)}))

    def heartbeat(self, *, lease_id: uuid.UUID, duration: float, progress: Sequence[ProgressReport] = ()) -> Heartbeat:
        params = heartbeat_params(lease_id, duration, progress)
        try:
            rows = self._execute("heartbeat", params)
        except StoreError as error:
            if not (progress and is_refused_heartbeat(error)):
                raise
            rows = self._execute("heartbeat", heartbeat_params(lease_id, duration, ()))
        return heartbeat_from_row(rows[0])

    def release_lease(self, *, lease_id: uuid.UUID) -> list[int]:
        """Hand the lease's running jobs back (ready, attempt refunded) and delete it."""
        return [row[0] for row in self._execute("release_lease", {"lease_id": lease_id})]

    def expire_leases(self, *, limit: int) -> int:
        """Delete up to ``limit`` lapsed leases and release their jobs; returns how many jobs."""
        if limit <= 0:
            return 0
        return self._execute("expire_leases", {"limit": limit, "observed": self.observed})[0][0]

    # -- jobs ----------------------------------------------------------------------------------

    def claim_jobs(self, *, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Lock up to ``limit`` due ready jobs of ``queues`` under a live lease, in claim order.

        One round-trip: the claim goes down one pipeline behind lock_limited_queues, in one
        transaction, so a queue's concurrency limit holds however many pumps claim at once.
        """
        claim = claim_statement(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit, admitted=self.admitted_queues)
        if claim is None:
            return []
        _, claimed = self._pipeline("claim_jobs", [_lock_statement(claim), claim])
        return self._claimed(claimed)

    def _claimed(self, rows: list[tuple]) -> list[ClaimedJob]:
        jobs = []
        for row in rows:
            if row[-1]:  # has_dependents
                self._ancestors[row[0]] = None
            jobs.append(_claimed_job(row[:-1]))
        while len(self._ancestors) > _ANCESTORS_KEPT:  # a job whose outcome this store never wrote
            del self._ancestors[next(iter(self._ancestors))]
        return jobs

    def claimed_with_dependents(self, job_id: int) -> bool:
        """Whether the job had dependents when this store claimed it: an atomic task's outcome,
        written on its handler's connection, is then the settling write at once. False for a job
        forgotten since (the plain write's fence leaves such an outcome to the settling write)."""
        return job_id in self._ancestors

    def write_outcomes_many(self, *, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> Applied:
        """Apply fenced outcomes and log one attempt per applied outcome; returns applied ids.
        A row whose data cannot be stored costs that row alone (see the Storage Contract)."""
        if not outcomes:
            return Applied()
        return write_isolating(lambda records: self._write_outcomes(lease_id, records), outcomes)

    def write_outcomes_then_claim(
        self, *, lease_id: uuid.UUID, worker_id: str, outcomes: Sequence[OutcomeRecord], queues: Sequence[str], limit: int
    ) -> tuple[Applied, list[ClaimedJob]]:
        """Write outcomes, then claim, in one round-trip; the claim sees the write's effects."""

        def together(claim: tuple[str, dict[str, Any]]) -> tuple[Applied, list[ClaimedJob]]:
            params, replaced = outcome_batch(lease_id, outcomes)
            params["observed"] = self.observed
            statements = self._write_statements(lease_id, outcomes, params)
            *_, written, _, claimed = self._pipeline("write_outcomes_then_claim", [*statements, _lock_statement(claim), claim])
            applied = self._settle_missed(lease_id, outcomes, statements, applied_from_rows(written, replaced))
            return applied, self._claimed(claimed)

        return write_then_claim(
            self,
            lease_id=lease_id,
            worker_id=worker_id,
            outcomes=outcomes,
            queues=queues,
            limit=limit,
            together=together,
            write=lambda records: self._write_outcomes(lease_id, records),
        )

    def _write_outcomes(self, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord], *, settling: bool = False) -> Applied:
        """One outcome statement (one round-trip): write_outcomes_plain when no job of the batch
        had dependents when claimed, else write_outcomes_many behind lock_outcome_jobs; then,
        only if the plain write left some outcome unapplied, the settling write of those."""
        params, replaced = outcome_batch(lease_id, outcomes)
        params["observed"] = self.observed
        statements = self._write_statements(lease_id, outcomes, params, settling=settling)
        written = self._pipeline(statements[-1][0], statements)[-1]
        return self._settle_missed(lease_id, outcomes, statements, applied_from_rows(written, replaced))

    def _write_statements(
        self, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord], params: dict[str, Any], *, settling: bool = False
    ) -> list[tuple[str, dict[str, Any]]]:
        """The plain write when no job of the batch had dependents when claimed (and ``settling``
        is not asked for); else write_outcomes_many, the batch's jobs forgotten as ancestors (a
        job claimed again is remembered again by its claim)."""
        ancestors = self._ancestors
        if not settling and not any(o.job_id in ancestors for o in outcomes):
            return [("write_outcomes_plain", params)]
        for o in outcomes:
            ancestors.pop(o.job_id, None)
        return [("write_outcomes_many", params)]

    def _settle_missed(
        self, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord], statements: list[tuple[str, Any]], applied: Applied
    ) -> Applied:
        """``applied``, and when the plain write left outcomes unapplied (not busy), those written
        again by the settling write: a job given a dependent while it ran, or one the fence
        refuses (for which the second write is refused too)."""
        if statements[-1][0] != "write_outcomes_plain" or len(applied) + len(applied.busy) == len(outcomes):
            return applied
        missed = [o for o in outcomes if o.job_id not in applied and o.job_id not in applied.busy]
        return applied.joined(self._write_outcomes(lease_id, missed, settling=True))

    def _pipeline(self, operation: str, statements: list[tuple[str, Mapping[str, Any]]]) -> list[list[tuple]]:
        """Run the named statements in order in one round-trip and one transaction."""
        return self._round_trip(operation, [(name, QUERIES[name], params) for name, params in statements])

    def _round_trip(self, operation: str, statements: list[tuple[str, str, Any]]) -> list[list[tuple]]:
        """Run ``(name, sql, params)`` statements in order in one round-trip and one transaction,
        after the per-transaction settings; the rows of each (the settings' left out).

        They go down one pipeline and share one implicit transaction, closed by the single Sync
        psycopg sends when the pipeline block exits. If one fails, the server skips every later
        message up to that Sync and the earlier ones roll back with it: the first error is raised
        here, naming the statement refused (``StoreError.statement``), and nothing is half-done.
        """
        head = self._transaction_settings
        if head is not None:
            statements = [("set_transaction_settings", *head), *statements]
        refused: str | None = None
        try:
            with self._guard(operation) as conn:
                self.round_trips += 1
                kept = self._cursors_for(conn, len(statements))
                if len(statements) == 1:
                    ((refused, sql, params),) = statements
                    cursor = _send(conn, kept[0], sql, params)
                    return [_rows(cursor)]
                cursors: list[psycopg.Cursor] = []
                try:
                    with conn.pipeline():
                        for (_, sql, params), cursor in zip(statements, kept):
                            cursors.append(_send(conn, cursor, sql, params))
                except psycopg.Error:
                    # The statement refused is the first without an answer: earlier ones have
                    # their results, the server skipped the later ones.
                    answered = sum(1 for cursor in cursors if cursor.pgresult is not None)
                    position = min(answered, len(statements) - 1)
                    refused = statements[position][0]
                    if position < len(statements) - 1:
                        # psycopg records a statement as prepared when it queues its Parse; in an
                        # aborted pipeline the server skips the Parse of every statement after the
                        # refused one, and the cache would name a statement that does not exist
                        # ("prepared statement _pg3_N does not exist" on the next call). Only a
                        # fresh connection is certain to be clean; this is the error path only.
                        # The refused statement's own Parse ran (ours fail at Bind or Execute), so
                        # when it is the last, as behind the settings, the connection is kept.
                        self._drop_connection()
                    raise
                results = [_rows(cursor) for cursor in cursors]
                return results[1:] if head is not None else results
        except StoreError as error:
            if refused is not None:
                error.statement = refused
            raise

    def forget_overruns(self, *, lease_id: uuid.UUID, attempts: Sequence[tuple[int, int]]) -> int:
        """Delete the lease's overruns of these (job id, attempt): their handlers returned."""
        if not attempts:
            return 0
        job_ids, numbers = zip(*attempts)
        return self._execute("forget_overruns", {"lease_id": lease_id, "job_ids": list(job_ids), "attempts": list(numbers)})[0][0]

    def release_jobs_many(self, *, lease_id: uuid.UUID, job_ids: Sequence[int]) -> Released:
        """Give unfinished jobs back (ready, due now, attempt refunded), fenced like outcomes;
        ``busy``: those passed over, their rows held by another transaction."""
        if not job_ids:
            return Released()
        rows = self._execute("release_jobs_many", {"lease_id": lease_id, "job_ids": list(job_ids)})
        return Released((job_id for job_id, busy in rows if not busy), busy=(job_id for job_id, busy in rows if busy))

    def reconcile_lease(self, *, lease_id: uuid.UUID, known: Sequence[tuple[int, int]]) -> Released:
        """Give back the jobs running under the lease at an attempt not in ``known`` ((job id,
        attempt) pairs, after a claim whose answer was lost); returns their (id, attempt), and
        as ``busy`` the ids of those passed over (rows held)."""
        params = {"lease_id": lease_id, **known_params(known)}
        rows = self._execute("reconcile_lease", params)
        return Released(
            ((job_id, attempt) for job_id, attempt, busy in rows if not busy), busy=(row[0] for row in rows if row[2])
        )

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[int]:
        """Insert jobs in one statement; returns their ids in input order."""
        if not jobs:
            return []
        return inserted_ids(*run_enqueue(self._execute, jobs, hint=True, observed=self.observed))

    # -- transition observers -------------------------------------------------------------------

    def claim_transitions(
        self, *, token: uuid.UUID, limit: int, lease: float, observers: Sequence[str] = (), deliverer: str | None = None
    ) -> list[TransitionRecord]:
        """Claim up to ``limit`` due transitions waiting for one of ``observers`` under ``token``
        for ``lease`` seconds, recording ``deliverer`` (this process) and those observers."""
        if limit <= 0:
            return []
        rows = self._execute(
            "claim_transitions",
            {
                "token": token,
                "limit": limit,
                "lease": lease_seconds(lease),
                "registered": sorted(set(observers)),
                "deliverer": deliverer,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
            },
        )
        return sorted((transition_record(row) for row in rows), key=lambda t: t.id)

    def settle_transitions(self, *, token: uuid.UUID, results: Sequence[DeliveryResult]) -> set[int]:
        """Delete what was delivered, keep what failed (due later, or dead); fenced by ``token``."""
        if not results:
            return set()
        return {row[0] for row in self._execute("settle_transitions", delivery_params(token, results))}

    # -- maintenance: schedules, retention, pump health -----------------------------------------

    def sync_schedules(self, *, schedules: Sequence[ScheduleDefinition]) -> list[str]:
        """Write the declared schedules and disable the undeclared; returns the names disabled."""
        rows = [
            {
                "name": d.name,
                "task_path": d.task_path,
                "cron": d.cron,
                "args": list(d.args),
                "kwargs": dict(d.kwargs),
                "queue": d.queue,
                "priority": d.priority,
                "max_attempts": d.max_attempts,
                "backoff_base": d.backoff_base,
                "backoff_max": d.backoff_max,
                "backend": d.backend,
                "tags": list(d.tags),
                "enabled": d.enabled,
                "timeout": d.timeout,
                "limit_key": d.limit_key,
            }
            for d in schedules
        ]
        return [row[0] for row in self._execute("sync_schedules", {"schedules": json.dumps(rows)})]

    def due_schedules(self, *, limit: int) -> list[DueSchedule]:
        """Enabled schedules with a slot due (or next_run unknown), with the database's now()."""
        rows = self._execute("due_schedules", {"limit": limit})
        return [DueSchedule(id=r[0], name=r[1], cron=r[2], next_run=r[3], db_now=r[4]) for r in rows]

    def mint_schedules_many(self, *, slots: Sequence[ScheduleSlot]) -> list[int]:
        """Mint each still-due slot as one job and move next_run on; returns the minted job ids."""
        if not slots:
            return []
        rows = [
            {
                "schedule_id": s.schedule_id,
                "cron": s.cron,
                "slot": s.slot.isoformat() if s.slot is not None else None,
                "next_run": s.next_run.isoformat(),
            }
            for s in slots
        ]
        return [row[0] for row in self._execute("mint_schedules_many", {"slots": json.dumps(rows)})]

    def purge_jobs(self, *, older_than: Sequence[tuple[str, float]], limit: int) -> int:
        """Delete up to ``limit`` finished jobs past their state's retention; returns how many."""
        if limit <= 0 or not older_than:
            return 0
        rows = [{"state": state, "seconds": float(seconds)} for state, seconds in older_than]
        return self._execute("purge_jobs", {"older_than": json.dumps(rows), "limit": limit})[0][0]

    def roll_up_task_stats(self, *, limit: int, settle: float = ROLLUP_SETTLE) -> int:
        """Fold up to ``limit`` finished attempts into the per-task statistics; returns how many."""
        if limit <= 0:
            return 0
        params = {"limit": int(limit), "settle": float(settle), **taskstats.SQL_PARAMS}
        return self._execute("roll_up_task_stats", params)[0][0]

    def record_pumps_many(self, *, pumps: Sequence[PumpHealth]) -> None:
        """Upsert each pump's health row, last_heartbeat_at = now()."""
        if not pumps:
            return
        rows = [
            {
                "worker_id": p.worker_id,
                "group": p.group,
                "hostname": p.hostname,
                "pid": p.pid,
                "status": p.status,
                "reason": clean_text(p.reason),
                "in_flight": p.in_flight,
                "queues": list(p.queues),
                "lease_duration": float(p.lease_duration),
            }
            for p in pumps
        ]
        self._execute("record_pumps_many", {"pumps": json.dumps(rows)})

    def forget_pumps_many(self, *, worker_ids: Sequence[str]) -> int:
        """Delete these pumps' health rows; returns how many there were."""
        if not worker_ids:
            return 0
        return self._execute("forget_pumps_many", {"worker_ids": list(worker_ids)})[0][0]

    def unserved_queues(self) -> list[tuple[str, float]]:
        """Queues with a due ready job that no live pump serves, and how long it waited (see the contract)."""
        return [(queue, float(seconds)) for queue, seconds in self._execute("unserved_queues", {})]

    def refresh_statistics(self) -> list[str]:
        """ANALYZE the busy tables whose statistics fell behind (see the contract); SKIP_LOCKED,
        so a table another session is vacuuming or analyzing is left to it. Two round-trips when
        something is stale (ANALYZE is a utility statement, chosen after the check), one when not."""
        base, fraction = STALE_STATISTICS
        stale = [
            row[0]
            for row in self._execute("stale_statistics", {"tables": list(ANALYZED_TABLES), "base": base, "fraction": fraction})
        ]
        if stale:
            self._pipeline("refresh_statistics", [(f"analyze_{table}", {}) for table in stale])
        return stale

    def purge_pumps(self, *, older_than: float) -> int:
        """Delete health rows silent for more than ``older_than`` seconds; returns how many."""
        return self._execute("purge_pumps", {"older_than": float(older_than)})[0][0]

    def purge_task_stats(self, *, older_than: Sequence[tuple[int, float]], limit: int) -> int:
        """Delete up to ``limit`` statistics buckets past their resolution's retention."""
        if not older_than or limit < 1:
            return 0
        params = {
            "resolutions": [int(r) for r, _ in older_than],
            "seconds": [float(s) for _, s in older_than],
            "limit": int(limit),
        }
        return self._execute("purge_task_stats", params)[0][0]

    # -- connection ----------------------------------------------------------------------------

    @property
    def backend_pid(self) -> int:
        """Process id of the server backend serving this store (connecting if need be)."""
        with self._guard("backend_pid") as conn:
            return conn.info.backend_pid

    def close(self) -> None:
        """Close the connection; later calls raise StoreError."""
        self._closed = True
        self._drop_connection()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _execute(self, name: str, params: Mapping[str, Any]) -> list[tuple]:
        """Run the named statement in one round-trip; its rows, or [] when it returns none."""
        return self._round_trip(name, [(name, QUERIES[name], params)])[0]

    @contextmanager
    def _guard(self, operation: str) -> Iterator[psycopg.Connection]:
        """Yield a live connection; translate psycopg errors, dropping a connection that broke."""
        try:
            yield self._connection()
        except psycopg.Error as exc:
            self._cursors, self._cursors_of = [], None  # whatever state a failed statement left them in
            broken = self._conn is not None and self._conn.closed
            if broken:
                self._conn = None  # the next call reconnects
            detail = f" [{exc.sqlstate}]" if exc.sqlstate else ""
            raise store_error(
                exc, f"{operation} failed{detail}: {exc}".strip(), statement=operation, connection_broken=broken
            ) from exc

    def _cursors_for(self, conn: psycopg.Connection, count: int) -> list[psycopg.RawCursor]:
        """``count`` cursors on ``conn`` for the statements of one round-trip, the same ones
        every round-trip. A new cursor starts with an empty cache of dumpers and loaders, so each
        statement on one looked up how to send every parameter and read every column again:
        about 40 us of client CPU a statement, four a steady pump round-trip. Each statement's
        rows are read before the next round-trip reuses its cursor."""
        if self._cursors_of is not conn:
            self._cursors, self._cursors_of = [], conn
        cursors = self._cursors
        while len(cursors) < count:
            cursors.append(psycopg.RawCursor(conn))
        return cursors

    def _drop_connection(self) -> None:
        self._cursors, self._cursors_of = [], None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self) -> psycopg.Connection:
        if self._closed:
            raise StoreError("this PostgresStore is closed; build a new one")
        if self._conn is None or self._conn.closed:
            self._conn = None
            try:
                self._conn = psycopg.connect(**self._connect_params)
                self.session_pid = self._conn.info.backend_pid
            except psycopg.Error as exc:
                if is_transient(exc):
                    raise TransientStoreError(f"cannot connect to PostgreSQL: {exc}".strip()) from exc
                refusal = connect_refusal(str(exc))
                detail = f" [{refusal}], and retrying will not help: check the connection settings" if refusal else ""
                raise StoreError(f"cannot connect to PostgreSQL{detail}: {exc}".strip()) from exc
        return self._conn


_NATIVE: dict[str, tuple[bytes, tuple[str, ...]] | None] = {}


def _send(conn: psycopg.Connection, cursor: psycopg.RawCursor, sql: str, params: Any) -> psycopg.Cursor:
    """Execute one statement of a round-trip on ``cursor``: named parameters through its native
    form (a statement without one goes through a client-side cursor of its own)."""
    if isinstance(params, Mapping):
        try:
            native = _NATIVE[sql]
        except KeyError:
            native = _NATIVE[sql] = native_statement(sql)
        if native is not None:
            text, names = native
            return cursor.execute(text, [params[name] for name in names])
    return conn.execute(sql, params)


def _rows(cursor: psycopg.Cursor) -> list[tuple]:
    """The statement's rows, or [] when it returns none. Read from the result's status, not
    ``cursor.description``, which builds a Column object per column on every call (about a
    fifth of a round-trip's client CPU for the 16-column claim)."""
    result = cursor.pgresult
    return cursor.fetchall() if result is not None and result.status == _TUPLES_OK else []


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _milliseconds(name: str, seconds: float | None) -> str | None:
    """A timeout for set_config(), in whole milliseconds (at least 1: 0 would mean no limit)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{name} must be a finite number of seconds above 0, or None to leave the session's value; got {seconds!r}"
        )
    return f"{max(1, round(seconds * 1000))}ms"


def _lock_statement(claim: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """lock_limited_queues for the queues of a claim statement."""
    name, params = claim
    lock = "lock_admitted_queues" if name == "claim_jobs_admitted" else "lock_limited_queues"
    return lock, {"queues": [params["queue"]] if "queue" in params else params["queues"]}


def _claimed_job(row: tuple) -> ClaimedJob:
    (
        job_id,
        task_path,
        queue,
        priority,
        payload,
        attempt,
        max_attempts,
        backoff_base,
        backoff_max,
        backend,
        enqueued_at,
        started_at,
        attempted_at,
        previous_worker_ids,
        forgiven_attempts,
        suspect,
        trace_context,
        timeout,
        cancel_requested_by,
    ) = row
    return ClaimedJob(
        id=job_id,
        task_path=task_path,
        queue=queue,
        priority=priority,
        payload=payload,
        attempt=attempt,
        max_attempts=max_attempts,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        backend=backend,
        enqueued_at=enqueued_at,
        started_at=started_at,
        attempted_at=attempted_at,
        previous_worker_ids=tuple(previous_worker_ids) if previous_worker_ids else (),
        forgiven_attempts=forgiven_attempts,
        suspect=suspect,
        trace_context=trace_context,
        timeout=timeout,
        cancel_requested_by=cancel_requested_by,
    )

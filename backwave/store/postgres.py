"""PostgresStore: the Storage Contract on PostgreSQL, one SQL statement per operation.

Theory of operation. A store owns one psycopg connection in autocommit mode, so every statement
is its own transaction and no lock outlives the call that took it. Each operation is a single
hand-written statement from ``queries.sql`` (one network round-trip, counted in ``round_trips``);
the one exception is ``write_outcomes_then_claim``, which pipelines two statements into one
round-trip. Hot statements become server-side prepared after ``prepare_threshold`` uses.

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
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from backwave.core.jobs import ClaimedJob, OutcomeKind

from .contract import DueSchedule, NewJob, OutcomeRecord, PumpHealth, ScheduleDefinition, ScheduleSlot, StoreError, TransientStoreError
from .enqueue import insert_jobs
from .queries import QUERIES

DEFAULT_APPLICATION_NAME = "backwave"
DEFAULT_CONNECT_TIMEOUT = 10  # seconds (libpq's connect_timeout)

# Prepared on the second use: the claim, the outcome write and the heartbeat run thousands of
# times per connection, so parsing and planning them once pays off at once. Pass None behind a
# pooler that cannot keep prepared statements (PgBouncer in transaction mode before 1.21).
DEFAULT_PREPARE_THRESHOLD = 1

# SQLSTATEs worth a retry on a later tick; class 08 (connection exception) and class 53
# (insufficient resources: too many connections, out of memory) are transient as a whole.
TRANSIENT_SQLSTATES = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, shutting down, in recovery)
})
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


def connect_refusal(message: str) -> str | None:
    """The SQLSTATE of a connect-time refusal no retry cures, read from its message; else None."""
    for sqlstate, pattern in PERMANENT_CONNECT_REFUSALS:
        if pattern.search(message):
            return sqlstate
    return None


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
    ) -> None:
        params = conninfo_to_dict(conninfo) if isinstance(conninfo, str) else dict(conninfo)
        if not synchronous_commit:
            # Set at connect time (libpq 'options'), so it costs no round-trip and survives
            # every reconnect. See BACKWAVE["WORKER_SYNCHRONOUS_COMMIT"] for why it is safe.
            params["options"] = f"{params.get('options', '')} -c synchronous_commit=off".strip()
        params.setdefault("application_name", application_name)
        # A host that does not answer (a network partition, not a refused connection) must not
        # hold the pump in connect() for ever: it reports a transient fault and retries.
        params.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        params.setdefault("prepare_threshold", prepare_threshold)
        params["autocommit"] = True
        self._connect_params = params
        self._conn: psycopg.Connection | None = None
        self._closed = False
        # Network round-trips of store operations, one per call that reaches the server. Not
        # counted: connecting, and the one extra exchange psycopg spends preparing each
        # statement the first time it is prepared on a connection.
        self.round_trips = 0
        self._connection()

    @classmethod
    def from_django(cls, alias: str = "default", **kwargs: Any) -> PostgresStore:
        """A store on the database of ``settings.DATABASES[alias]``, with a connection of its own."""
        from django.conf import settings

        from backwave import conf

        kwargs.setdefault("synchronous_commit", conf.get_setting("WORKER_SYNCHRONOUS_COMMIT"))
        return cls(django_conninfo(settings.DATABASES[alias]), **kwargs)

    # -- leases --------------------------------------------------------------------------------

    def open_lease(self, *, lease_id: uuid.UUID, worker_id: str, group: str, hostname: str, pid: int, duration: float) -> None:
        """Create the pump's lease, expiring ``duration`` seconds from now by the database clock."""
        params = {"lease_id": lease_id, "worker_id": worker_id, "group": group, "hostname": hostname, "pid": pid, "duration": _seconds(duration)}
        self._execute("open_lease", params)

    def renew_lease(self, *, lease_id: uuid.UUID, duration: float) -> bool:
        """Push the lease's expiry to now + duration. False when it is gone or already lapsed."""
        return bool(self._execute("renew_lease", {"lease_id": lease_id, "duration": _seconds(duration)}))

    def release_lease(self, *, lease_id: uuid.UUID) -> list[int]:
        """Hand the lease's running jobs back (ready, attempt refunded) and delete it."""
        return [row[0] for row in self._execute("release_lease", {"lease_id": lease_id})]

    def expire_leases(self, *, limit: int) -> int:
        """Delete up to ``limit`` lapsed leases and release their jobs; returns how many jobs."""
        if limit <= 0:
            return 0
        return self._execute("expire_leases", {"limit": limit})[0][0]

    # -- jobs ----------------------------------------------------------------------------------

    def claim_jobs(self, *, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Lock up to ``limit`` due ready jobs of ``queues`` under a live lease, in claim order.

        One round-trip: the claim goes down one pipeline behind lock_limited_queues, in one
        transaction, so a queue's concurrency limit holds however many pumps claim at once.
        """
        claim = _claim_statement(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit)
        if claim is None:
            return []
        _, claimed = self._pipeline("claim_jobs", [_lock_statement(claim), claim])
        return [_claimed_job(row) for row in claimed]

    def write_outcomes_many(self, *, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> set[int]:
        """Apply fenced outcomes and log one attempt per applied outcome; returns applied ids."""
        if not outcomes:
            return set()
        return {row[0] for row in self._execute("write_outcomes_many", _outcome_params(lease_id, outcomes))}

    def write_outcomes_then_claim(
        self, *, lease_id: uuid.UUID, worker_id: str, outcomes: Sequence[OutcomeRecord], queues: Sequence[str], limit: int
    ) -> tuple[set[int], list[ClaimedJob]]:
        """Write outcomes, then claim, in one round-trip; the claim sees the write's effects."""
        claim = _claim_statement(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit)
        if not outcomes:
            return set(), self.claim_jobs(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit)
        if claim is None:
            return self.write_outcomes_many(lease_id=lease_id, outcomes=outcomes), []
        written, _, claimed = self._pipeline(
            "write_outcomes_then_claim",
            [("write_outcomes_many", _outcome_params(lease_id, outcomes)), _lock_statement(claim), claim],
        )
        return {row[0] for row in written}, [_claimed_job(row) for row in claimed]

    def _pipeline(self, operation: str, statements: list[tuple[str, Mapping[str, Any]]]) -> list[list[tuple]]:
        """Run the named statements in order in one round-trip and one transaction.

        They go down one pipeline and share one implicit transaction, closed by the single Sync
        psycopg sends when the pipeline block exits. If one fails, the server skips every later
        message up to that Sync and the earlier ones roll back with it: the first error is raised
        here and nothing is half-done.
        """
        with self._guard(operation) as conn:
            self.round_trips += 1
            try:
                with conn.pipeline():
                    cursors = [conn.execute(QUERIES[name], params) for name, params in statements]
            except psycopg.Error:
                # psycopg records a statement as prepared when it queues its Parse; in an aborted
                # pipeline the server skips that Parse, and the cache would name a statement that
                # does not exist ("prepared statement _pg3_N does not exist" on the next call).
                # Only a fresh connection is certain to be clean; this is the error path only.
                self._drop_connection()
                raise
            return [cursor.fetchall() if cursor.description is not None else [] for cursor in cursors]

    def release_jobs_many(self, *, lease_id: uuid.UUID, job_ids: Sequence[int]) -> set[int]:
        """Give unfinished jobs back (ready, due now, attempt refunded), fenced like outcomes."""
        if not job_ids:
            return set()
        return {row[0] for row in self._execute("release_jobs_many", {"lease_id": lease_id, "job_ids": list(job_ids)})}

    def reconcile_lease(self, *, lease_id: uuid.UUID, known: Sequence[int]) -> set[int]:
        """Give back the jobs running under the lease that are not in ``known`` (after a claim
        whose answer was lost); returns their ids."""
        return {row[0] for row in self._execute("reconcile_lease", {"lease_id": lease_id, "known": list(known)})}

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[int]:
        """Insert jobs in one statement; returns their ids in input order."""
        if not jobs:
            return []
        with self._guard("enqueue_many") as conn:
            self.round_trips += 1
            with conn.cursor() as cursor:
                return insert_jobs(cursor, jobs)

    # -- maintenance: schedules, retention, pump health -----------------------------------------

    def sync_schedules(self, *, schedules: Sequence[ScheduleDefinition]) -> list[str]:
        """Write the declared schedules and disable the undeclared; returns the names disabled."""
        rows = [
            {
                "name": d.name, "task_path": d.task_path, "cron": d.cron, "args": list(d.args), "kwargs": dict(d.kwargs),
                "queue": d.queue, "priority": d.priority, "max_attempts": d.max_attempts, "backoff_base": d.backoff_base,
                "backoff_max": d.backoff_max, "backend": d.backend, "tags": list(d.tags), "enabled": d.enabled,
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
                "schedule_id": s.schedule_id, "cron": s.cron,
                "slot": s.slot.isoformat() if s.slot is not None else None, "next_run": s.next_run.isoformat(),
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

    def record_pumps_many(self, *, pumps: Sequence[PumpHealth]) -> None:
        """Upsert each pump's health row, last_heartbeat_at = now()."""
        if not pumps:
            return
        rows = [
            {
                "worker_id": p.worker_id, "group": p.group, "hostname": p.hostname, "pid": p.pid, "status": p.status,
                "reason": _text(p.reason), "in_flight": p.in_flight, "lease_duration": float(p.lease_duration),
            }
            for p in pumps
        ]
        self._execute("record_pumps_many", {"pumps": json.dumps(rows)})

    def forget_pumps_many(self, *, worker_ids: Sequence[str]) -> int:
        """Delete these pumps' health rows; returns how many there were."""
        if not worker_ids:
            return 0
        return self._execute("forget_pumps_many", {"worker_ids": list(worker_ids)})[0][0]

    def purge_pumps(self, *, older_than: float) -> int:
        """Delete health rows silent for more than ``older_than`` seconds; returns how many."""
        return self._execute("purge_pumps", {"older_than": float(older_than)})[0][0]

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
        with self._guard(name) as conn:
            self.round_trips += 1
            cursor = conn.execute(QUERIES[name], params)
            return cursor.fetchall() if cursor.description is not None else []

    @contextmanager
    def _guard(self, operation: str) -> Iterator[psycopg.Connection]:
        """Yield a live connection; translate psycopg errors, dropping a connection that broke."""
        try:
            yield self._connection()
        except psycopg.Error as exc:
            broken = self._conn is not None and self._conn.closed
            if broken:
                self._conn = None  # the next call reconnects
            error = TransientStoreError if is_transient(exc, connection_broken=broken) else StoreError
            detail = f" [{exc.sqlstate}]" if exc.sqlstate else ""
            raise error(f"{operation} failed{detail}: {exc}".strip()) from exc

    def _drop_connection(self) -> None:
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
            except psycopg.Error as exc:
                if is_transient(exc):
                    raise TransientStoreError(f"cannot connect to PostgreSQL: {exc}".strip()) from exc
                refusal = connect_refusal(str(exc))
                detail = f" [{refusal}], and retrying will not help: check the connection settings" if refusal else ""
                raise StoreError(f"cannot connect to PostgreSQL{detail}: {exc}".strip()) from exc
        return self._conn


def _seconds(duration: float) -> float:
    if not duration > 0:
        raise ValueError(f"a lease duration must be a positive number of seconds, got {duration!r}")
    return float(duration)


def _claim_statement(*, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int) -> tuple[str, dict[str, Any]] | None:
    """The claim query's name and parameters, or None when nothing can be claimed."""
    if isinstance(queues, str):
        raise TypeError(f"queues must be a sequence of queue names, not the string {queues!r}; pass [{queues!r}]")
    unique = list(dict.fromkeys(queues))  # a queue listed twice would see its own locked rows again
    if limit <= 0 or not unique:
        return None
    params: dict[str, Any] = {"lease_id": lease_id, "worker_id": worker_id, "limit": limit}
    if len(unique) == 1:
        return "claim_jobs_one_queue", {**params, "queue": unique[0]}
    return "claim_jobs_many_queues", {**params, "queues": unique}


def _lock_statement(claim: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """lock_limited_queues for the queues of a claim statement."""
    params = claim[1]
    return "lock_limited_queues", {"queues": [params["queue"]] if "queue" in params else params["queues"]}


def _claimed_job(row: tuple) -> ClaimedJob:
    (job_id, task_path, queue, priority, payload, attempt, max_attempts, backoff_base, backoff_max,
     backend, enqueued_at, started_at, attempted_at, previous_worker_ids) = row
    return ClaimedJob(
        id=job_id, task_path=task_path, queue=queue, priority=priority, payload=payload, attempt=attempt,
        max_attempts=max_attempts, backoff_base=backoff_base, backoff_max=backoff_max, backend=backend,
        enqueued_at=enqueued_at, started_at=started_at, attempted_at=attempted_at,
        previous_worker_ids=tuple(previous_worker_ids) if previous_worker_ids else (),
    )


def _outcome_params(lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> dict[str, Any]:
    """The parameters of write_outcomes_many: the batch as one JSON array.

    A SUCCEEDED outcome's return value travels boxed as ``{"v": value}``, so a task that returned
    None stores JSON ``null`` (a value); every other kind stores SQL NULL (no value at all).
    A return value PostgreSQL could not store (not JSON, NaN, a NUL character) is refused here,
    before anything is sent, naming the job: one bad value would otherwise fail the whole batch.
    """
    if len({o.job_id for o in outcomes}) != len(outcomes):
        seen: set[int] = set()
        duplicate = next(o.job_id for o in outcomes if o.job_id in seen or seen.add(o.job_id))
        raise ValueError(f"job {duplicate} has two outcomes in one batch; a batch holds one outcome per job")
    succeeded = OutcomeKind.SUCCEEDED
    rows = [
        {
            "job_id": o.job_id,
            "attempt": o.attempt,
            "kind": o.kind.value,
            "retry_delay": float(o.retry_delay or 0.0),
            "boxed": {"v": o.return_value} if o.kind is succeeded else None,
            "error_class": _text(o.error_class),
            "traceback": _text(o.traceback),
            "duration": float(o.duration),
        }
        for o in outcomes
    ]
    # One encode for the whole batch on the hot path; only when it fails, or when a NUL escape
    # shows up, is each return value checked alone to name the job at fault.
    try:
        encoded = json.dumps(rows, allow_nan=False)
    except (TypeError, ValueError):
        encoded = None
    if encoded is None or _JSON_NUL.search(encoded):
        for outcome in outcomes:
            _check_return_value(outcome)
        encoded = json.dumps(rows, allow_nan=False)
    return {"lease_id": lease_id, "outcomes": encoded}


# A \u0000 escape in JSON text, not preceded by an escaped backslash of the string's own.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _text(value: str) -> str:
    """PostgreSQL text cannot hold NUL; an exception message that carries one is shown escaped."""
    return value.replace("\x00", "\\x00")


def _check_return_value(outcome: OutcomeRecord) -> None:
    """Raise ValueError naming the job when its return value cannot be stored as jsonb."""
    if outcome.kind is not OutcomeKind.SUCCEEDED:
        return
    try:
        encoded = json.dumps(outcome.return_value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {outcome.job_id}: the return value is not JSON-serialisable ({exc}); return JSON types only") from exc
    if _JSON_NUL.search(encoded):
        raise ValueError(f"job {outcome.job_id}: the return value contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store")

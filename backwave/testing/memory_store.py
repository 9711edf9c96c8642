"""InMemoryStore: the Storage Contract in plain Python, for the simulator and fast tests.

Theory of operation. A ``MemoryDatabase`` holds the three tables (jobs, leases, attempts) as
dicts of rows, behind one lock, and reads its clock from an injected callable that returns the
current time as an aware datetime: it stands in for PostgreSQL's ``now()``, and is read once
per operation, as a statement sees one ``now()``. Each ``InMemoryStore`` is one "connection" to
such a database (several stores may share one, as several pumps share one PostgreSQL).

Every operation mirrors its statement in ``queries.sql``, clause for clause; the comments name
the clause. The inputs travel through the same encoders as PostgresStore's (``backwave.store.params``:
``outcome_batch``, ``insert_jobs_params``, ``claim_statement``), so a value PostgreSQL would refuse is refused here
with the same error, before anything changes. What the server itself refuses in an outcome batch
(a lone surrogate in jsonb, a number past numeric, a time past timestamptz) is refused here with
the server's SQLSTATE, and isolated by the same bisection (``write_isolating``); a document taken
whole (an enqueue's) is read as psycopg sends it and jsonb's input reads it (``jsonb_input``).
The contract tests in ``tests/store`` run against both stores, so the two cannot drift.

Operations are atomic (the lock is held for the whole operation), which is what PostgreSQL's
row locks, SKIP LOCKED and one-statement transactions give the real store.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from backwave import taskstats
from backwave.core.jobs import ClaimedJob

from backwave.store.contract import (
    NOTHING_OBSERVED,
    ROLLUP_SETTLE,
    Applied,
    DeliveryResult,
    DependencyRefused,
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
    TransitionRecord,
)
from backwave.store.params import (
    applied_from_rows,
    claim_statement,
    delivery_params,
    dependency_refusal,
    heartbeat_params,
    insert_statement,
    known_params,
    lease_seconds,
    outcome_batch,
    write_isolating,
    write_then_claim,
)
from backwave.store.storable import NUMERIC_MAX_DIGITS, clean_text, text_problem
from backwave.taskstats import TaskSummary

_TERMINAL_STATE = {
    "succeeded": "succeeded",
    "retry": "ready",
    "snoozed": "ready",
    "failed": "failed",
    "cancelled": "cancelled",
    "quarantined": "quarantined",
}
_ATTEMPT_STATE = {
    "succeeded": "succeeded",
    "quarantined": "quarantined",
    "retry": "failed",
    "failed": "failed",
    "cancelled": "cancelled",
    "snoozed": "snoozed",
}
_AGAIN = ("retry", "snoozed")  # the kinds that make the job ready again
_MAX_PRIORITY = 100
_LOG2_10 = math.log2(10)
_FINISHED = ("succeeded", "failed", "cancelled", "quarantined")
_ENDED_BADLY = ("failed", "cancelled", "quarantined")


def wall_clock() -> datetime:
    """The default clock: the host's, in UTC. Tests and the simulator inject a virtual one."""
    return datetime.now(UTC)


@dataclass(slots=True, kw_only=True)
class JobRow:
    """A row of backwave_job. ``return_value_json`` is the jsonb text, or None for SQL NULL."""

    id: int
    task_path: str
    queue: str
    priority: int
    payload_json: str
    state: str
    backend: str
    tags: list[str]
    run_at: datetime
    enqueued_at: datetime
    started_at: datetime | None = None
    last_attempted_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    max_attempts: int = 1
    forgiven_attempts: int = 0
    suspect: bool = False
    backoff_base: float = 1.0
    backoff_max: float = 3600.0
    lease_id: uuid.UUID | None = None
    worker_id: str = ""
    return_value_json: str | None = None
    schedule_id: int | None = None
    schedule_slot: datetime | None = None
    output_json: str | None = None
    waiting_on: int = 0
    reason: str = ""
    timeout: float | None = None
    cancel_requested_at: datetime | None = None
    cancel_requested_by: str = ""
    progress_json: str | None = None
    metadata_json: str | None = None
    trace_context: dict | None = None
    limit_key: str | None = None
    unique_key: str | None = None
    unique_states: list[str] | None = None
    unique_replace: list[str] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # The trigger backwave_job_release_unique_key (migration 0008): a job leaving the states
        # its uniqueness covers lets go of its key for good.
        object.__setattr__(self, name, value)
        if name == "state" and getattr(self, "unique_key", None) is not None and value not in (self.unique_states or ()):
            object.__setattr__(self, "unique_key", None)

    @property
    def pk(self) -> int:
        return self.id

    @property
    def progress(self) -> Any:
        return None if self.progress_json is None else json.loads(self.progress_json)

    @property
    def metadata(self) -> Any:
        return None if self.metadata_json is None else json.loads(self.metadata_json)

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @property
    def output(self) -> Any:
        return None if self.output_json is None else json.loads(self.output_json)

    @property
    def return_value(self) -> Any:
        return None if self.return_value_json is None else json.loads(self.return_value_json)


@dataclass(slots=True, kw_only=True)
class LeaseRow:
    """A row of backwave_lease."""

    id: uuid.UUID
    worker_id: str
    group: str
    hostname: str
    pid: int
    created_at: datetime
    renewed_at: datetime
    expires_at: datetime

    @property
    def pk(self) -> uuid.UUID:
        return self.id


@dataclass(slots=True, kw_only=True)
class OverrunRow:
    """A row of backwave_overrun, keyed by (job id, attempt): a handler that outlived its attempt."""

    lease_id: uuid.UUID
    queue: str
    limit_key: str | None
    since: datetime


@dataclass(slots=True, kw_only=True)
class AttemptRow:
    """A row of backwave_attempt."""

    id: int  # from the table's sequence: insertion order
    job_id: int
    number: int
    state: str
    worker_id: str
    started_at: datetime | None
    finished_at: datetime
    lease_renewed_at: datetime | None = None
    error_class: str = ""
    traceback: str = ""
    return_value_json: str | None = None

    @property
    def return_value(self) -> Any:
        return None if self.return_value_json is None else json.loads(self.return_value_json)


@dataclass(slots=True, kw_only=True)
class ScheduleRow:
    """A row of backwave_schedule."""

    id: int
    name: str
    task_path: str
    cron: str
    args: Any
    kwargs: Any
    queue: str
    priority: int
    max_attempts: int
    backoff_base: float
    backoff_max: float
    backend: str
    tags: list[str]
    enabled: bool
    created_at: datetime
    timeout: float | None = None
    limit_key: str | None = None
    updated_at: datetime
    last_slot: datetime | None = None
    next_run: datetime | None = None

    @property
    def pk(self) -> int:
        return self.id


@dataclass(slots=True, kw_only=True)
class PumpRow:
    """A row of backwave_pump."""

    worker_id: str
    group: str
    hostname: str
    pid: int
    status: str
    reason: str
    in_flight: int
    lease_duration: float
    started_at: datetime
    last_heartbeat_at: datetime
    queues: list[str] = field(default_factory=list)

    @property
    def pk(self) -> str:
        return self.worker_id


@dataclass(slots=True, kw_only=True)
class TransitionRow:
    """A row of backwave_transition."""

    id: int
    job_id: int
    attempt: int
    kind: str
    task_path: str
    queue: str
    occurred_at: datetime
    state: str = "pending"
    deliveries: int = 0
    next_attempt_at: datetime
    claim_token: uuid.UUID | None = None
    delivered_to: list[str] = field(default_factory=list)
    failed_observer: str = ""
    last_error: str = ""
    observers: list[str] = field(default_factory=list)  # the observers it was noted for (none: any deliverer's)

    @property
    def waiting_for(self) -> list[str]:
        return [name for name in self.observers if name not in self.delivered_to]


@dataclass(slots=True, kw_only=True)
class DelivererRow:
    """A row of backwave_deliverer."""

    id: str
    hostname: str
    pid: int
    observers: list[str]
    seen_at: datetime


@lru_cache(maxsize=64)
def _watch_rules(observed: str) -> tuple[tuple[str, str | None, str | None, str | None], ...]:
    return tuple((w["kind"], w["task_path"], w["queue"], w.get("observer")) for w in json.loads(observed))


def _watchers(observed: str, kind: str, job: JobRow) -> list[str] | None:
    """The "noted" CTE's lateral: the named observers of that transition, sorted (None when no
    entry watches it at all)."""
    if observed == NOTHING_OBSERVED:
        return None
    matched = [o for k, t, q, o in _watch_rules(observed) if k == kind and t in (None, job.task_path) and q in (None, job.queue)]
    return sorted({o for o in matched if o is not None}) if matched else None


def _note(db: MemoryDatabase, now: datetime, observed: str, job: JobRow, attempt: int, kind: str) -> None:
    observers = _watchers(observed, kind, job)
    if observers is not None:
        db.last_transition_id += 1
        db.transitions[db.last_transition_id] = TransitionRow(
            id=db.last_transition_id,
            job_id=job.id,
            attempt=attempt,
            kind=kind,
            task_path=job.task_path,
            queue=job.queue,
            occurred_at=now,
            next_attempt_at=now,
            observers=observers,
        )


def _waits_for_one_of(row: TransitionRow, registered: set[str]) -> bool:
    """claim_transitions' filter: a row that names no observer, or waits for one registered."""
    return not row.observers or any(name in registered and name not in row.delivered_to for name in row.observers)


class QueueAdmission(NamedTuple):
    """A Queue row's admission columns."""

    key_concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    key_rate_limit: int | None = None

    @property
    def limited(self) -> bool:
        return self.key_concurrency_limit is not None or self.rate_limit is not None or self.key_rate_limit is not None


NO_ADMISSION = QueueAdmission()


def _room(db, queue: str, limit: int, *, admitted: bool = False, now: datetime | None = None) -> int:
    """What a claim may take from ``queue``, as claim_jobs_*'s LIMIT computes it (and
    claim_jobs_admitted's, with its rate window: ``admitted``)."""
    concurrency_limit, paused = db.queues.get(queue, (None, False))
    admission = db.admission.get(queue, NO_ADMISSION)
    rate_limit, rate_period = admission.rate_limit, admission.rate_period
    if paused:
        return 0
    if not admitted and admission.limited:
        return 0  # claimed only through claim_jobs_admitted
    room = limit
    if concurrency_limit is not None:
        running = sum(1 for job in db.jobs.values() if job.state == "running" and job.queue == queue)
        running += sum(1 for row in db.live_overruns(now) if row.queue == queue)  # handlers past their attempt
        room = min(room, concurrency_limit - running)
    if admitted and rate_limit is not None:
        start, used = db.rate_windows.get(queue, (None, 0))
        room = min(room, rate_limit - (used if start == rate_window_start(now, rate_period) else 0))
    return max(0, room)


def rate_window_start(now: datetime, period: float) -> datetime:
    """The start of the rate window ``now`` falls in: windows of ``period`` seconds aligned to
    the epoch, as to_timestamp(floor(extract(epoch FROM now()) / period) * period)."""
    return datetime.fromtimestamp(math.floor(now.timestamp() / period) * period, UTC)


def _stored_unique_key(row: dict[str, Any], now: datetime) -> str | None:
    """The key enqueue_unique_many stores: task path, key, and the period's window number."""
    if row.get("unique_key") is None:
        return None
    key = f"{row['task_path']}:{row['unique_key']}"
    period = row.get("unique_period")
    if period is not None:
        # float8::text: 3600 reads "3600", 0.5 "0.5".
        text = str(int(period)) if float(period).is_integer() else repr(float(period))
        key += f"@{text}s#{math.floor(now.timestamp() / period)}"
    return key


@dataclass(slots=True)
class MemoryDatabase:
    """The shared tables, their lock and their clock."""

    now: Callable[[], datetime] = wall_clock
    jobs: dict[int, JobRow] = field(default_factory=dict)
    leases: dict[uuid.UUID, LeaseRow] = field(default_factory=dict)
    attempts: dict[tuple[int, int], AttemptRow] = field(default_factory=dict)
    schedules: dict[int, ScheduleRow] = field(default_factory=dict)
    pumps: dict[str, PumpRow] = field(default_factory=dict)
    # The Queue table: name -> (concurrency_limit or None, paused).
    queues: dict[str, tuple[int | None, bool]] = field(default_factory=dict)
    # backwave_dependency: (job_id, ancestor_id) -> (on_failure, position).
    dependencies: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    transitions: dict[int, TransitionRow] = field(default_factory=dict)
    # backwave_overrun: (job_id, attempt) -> its row; a deleted lease takes its rows along (the
    # foreign key cascades: forget_leases below).
    overruns: dict[tuple[int, int], OverrunRow] = field(default_factory=dict)
    deliverers: dict[str, DelivererRow] = field(default_factory=dict)
    # Its admission columns, and the rate limit's current window: name -> (rate_window_start,
    # rate_window_used); backwave_key_rate_window: (queue, limit key) -> (window_start, used).
    admission: dict[str, QueueAdmission] = field(default_factory=dict)
    rate_windows: dict[str, tuple[datetime, int]] = field(default_factory=dict)
    key_rate_windows: dict[tuple[str, str], tuple[datetime, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Job rows another transaction holds (an application's open transaction, as PostgreSQL's row
    # locks): the engine's statements pass them over (SKIP LOCKED) and never wait for them. A
    # test adds and removes ids to play that transaction.
    held_rows: set[int] = field(default_factory=set)
    last_id: int = 0
    last_transition_id: int = 0
    last_schedule_id: int = 0
    last_attempt_id: int = 0
    # backwave_task_stat: (resolution, bucket, task_path) -> TaskSummary of that bucket.
    task_stats: dict[tuple[int, datetime, str], TaskSummary] = field(default_factory=dict)
    # backwave_stats_rollup: the watermark and the horizon (see roll_up_task_stats).
    stats_watermark: int = 0
    stats_horizon: int = 0
    stats_rolled_at: datetime | None = None

    def next_attempt_id(self) -> int:
        self.last_attempt_id += 1
        return self.last_attempt_id

    def live_overruns(self, now: datetime) -> list[OverrunRow]:
        """The overruns the claims count: those of leases that exist and have not lapsed."""
        return [row for row in self.overruns.values() if _live(self, row.lease_id, now)]

    def forget_leases(self, lease_ids: Iterable[uuid.UUID]) -> None:
        """Delete these leases, and their overruns with them (ON DELETE CASCADE)."""
        gone = set(lease_ids)
        for lease_id in gone:
            self.leases.pop(lease_id, None)
        if self.overruns:
            for key in [key for key, row in self.overruns.items() if row.lease_id in gone]:
                del self.overruns[key]

    def attempts_after(self, attempt_id: int) -> list[AttemptRow]:
        """The attempt rows with an id above ``attempt_id``, in id order. Rows are inserted with
        ever higher ids, so the dict's order is id order and this reads only those rows, from
        the end: the rollup and the purge ask it on every maintenance run."""
        newer = []
        for row in reversed(self.attempts.values()):
            if row.id <= attempt_id:
                break
            newer.append(row)
        newer.reverse()
        return newer

    def attempt_log(self) -> list[AttemptRow]:
        """Attempt rows in (job_id, number) order, as the Attempt model's ordering gives them."""
        return [self.attempts[key] for key in sorted(self.attempts)]

    def insert_job(self, **fields: Any) -> JobRow:
        """Insert one job row directly (tests' set-ups); unset timestamps default to now."""
        with self.lock:
            now = self.now()
            self.last_id += 1
            fields.setdefault("run_at", now)
            fields.setdefault("enqueued_at", now)
            fields.setdefault("backend", "default")
            fields.setdefault("tags", [])
            fields.setdefault("state", "ready")
            payload = fields.pop("payload", {"args": [], "kwargs": {}})
            row = JobRow(id=self.last_id, payload_json=json.dumps(payload), **fields)
            self.jobs[row.id] = row
            return row


class InMemoryStore:
    """The Storage Contract over a MemoryDatabase (a fresh one unless ``database`` is given)."""

    def __init__(
        self,
        database: MemoryDatabase | None = None,
        *,
        now: Callable[[], datetime] | None = None,
        admitted_queues: Iterable[str] = (),
    ):
        self.admitted_queues = frozenset(admitted_queues)
        if database is None:
            database = MemoryDatabase(now=now or wall_clock)
        elif now is not None:
            raise ValueError("pass the clock to the MemoryDatabase, not to a store that shares it")
        self.database = database
        self.round_trips = 0  # operations that would have reached the server, as PostgresStore counts them
        self._closed = False
        self.observed = NOTHING_OBSERVED  # which transitions the outcome operations note

    # -- leases --------------------------------------------------------------------------------

    def open_lease(self, *, lease_id: uuid.UUID, worker_id: str, group: str, hostname: str, pid: int, duration: float) -> None:
        """Create the pump's lease, expiring ``duration`` seconds from now by the database clock."""
        duration = lease_seconds(duration)
        with self._operation() as (db, now):
            if lease_id in db.leases:
                raise StoreError(
                    'open_lease failed [23505]: duplicate key value violates unique constraint "backwave_lease_pkey"'
                )
            db.leases[lease_id] = LeaseRow(
                id=lease_id,
                worker_id=worker_id,
                group=group,
                hostname=hostname,
                pid=pid,
                created_at=now,
                renewed_at=now,
                expires_at=now + timedelta(seconds=duration),
            )

    def renew_lease(self, *, lease_id: uuid.UUID, duration: float) -> bool:
        """Push the lease's expiry to now + duration. False when it is gone or already lapsed."""
        duration = lease_seconds(duration)
        with self._operation() as (db, now):
            lease = db.leases.get(lease_id)
            if lease is None or not lease.expires_at > now:  # "expires_at > now()": never revived
                return False
            lease.renewed_at = now
            lease.expires_at = now + timedelta(seconds=duration)
            return True

    def heartbeat(self, *, lease_id: uuid.UUID, duration: float, progress: Sequence[ProgressReport] = ()) -> Heartbeat:
        """renew_lease, writing the reports' progress to their jobs and reading the cancels."""
        params = heartbeat_params(lease_id, duration, progress)
        try:
            reports = jsonb_input(params["progress"], "heartbeat")
        except StoreError as refused:
            if not (refused.sqlstate or "").startswith("22"):
                raise
            reports = []  # PostgresStore sends it again without them
        if any(_jsonb_refusal(report) for report in reports):
            reports = []
        with self._operation() as (db, now):
            lease = db.leases.get(lease_id)
            if lease is None or not lease.expires_at > now:
                return Heartbeat(held=False)
            lease.renewed_at = now
            lease.expires_at = now + timedelta(seconds=params["duration"])
            busy = set()
            for report in reports:
                job = db.jobs.get(report["job_id"])
                if job is not None and job.lease_id == lease_id and job.state == "running" and job.attempts == report["attempt"]:
                    if job.id in db.held_rows:
                        busy.add(job.id)  # SKIP LOCKED: sent again with the next heartbeat
                    else:
                        _report(job, report)
            cancels = {
                job.id: job.cancel_requested_by
                for job in db.jobs.values()
                if job.lease_id == lease_id and job.state == "running" and job.cancel_requested_at is not None
            }
            return Heartbeat(held=True, cancels=cancels, busy=frozenset(busy))

    def release_lease(self, *, lease_id: uuid.UUID) -> list[int]:
        """Hand the lease's running jobs back (ready, attempt refunded) and delete it."""
        with self._operation() as (db, now):
            running = [job for job in db.jobs.values() if job.lease_id == lease_id and job.state == "running"]
            released = [job for job in running if job.id not in db.held_rows]  # SKIP LOCKED
            if len(released) < len(running):
                # A held row keeps the lease, lapsed from now on: expiry gives it back once it can.
                if (lease := db.leases.get(lease_id)) is not None:
                    lease.expires_at = min(lease.expires_at, now)
            else:
                db.forget_leases([lease_id])  # jobs are released even when the lease row is gone
            for job in released:
                _refund(job, now)
            return sorted(job.id for job in released)

    def expire_leases(self, *, limit: int) -> int:
        """Delete up to ``limit`` lapsed leases and release their jobs; returns how many jobs."""
        if limit <= 0:
            return 0
        with self._operation() as (db, now):
            lapsed = sorted(
                (lease for lease in db.leases.values() if lease.expires_at < now), key=lambda lease: lease.expires_at
            )[:limit]
            gone = {lease.id: lease for lease in lapsed}
            # "j.state = 'running'": never resurrects a finished job.
            running = [job for job in db.jobs.values() if job.lease_id in gone and job.state == "running"]
            released = [job for job in running if job.id not in db.held_rows]  # SKIP LOCKED
            if any((job.id, job.attempts) in db.attempts for job in released):
                raise StoreError(
                    'expire_leases failed [23505]: duplicate key value violates unique constraint "backwave_attempt_once"'
                )
            # A lease with a held job stays, lapsed, for a later run to give that job back.
            keeping = {job.lease_id for job in running if job.id in db.held_rows}
            db.forget_leases([lease_id for lease_id in gone if lease_id not in keeping])
            failed_for_good: dict[int, str] = {}
            for job in released:
                lease = gone[job.lease_id]
                # Not suspect: forgiven (not counted), and suspect from now on. Suspect: it pays.
                was_suspect = job.suspect
                again = not was_suspect or job.attempts - job.forgiven_attempts < job.max_attempts
                job.state = "ready" if again else "failed"
                if again:
                    job.run_at = now
                job.finished_at = None if again else now
                if not was_suspect:
                    job.forgiven_attempts += 1
                job.suspect = True
                job.lease_id = None
                if not again:
                    failed_for_good[job.id] = "failed"
                db.attempts[(job.id, job.attempts)] = AttemptRow(
                    id=db.next_attempt_id(),
                    job_id=job.id,
                    number=job.attempts,
                    state="lapsed",
                    worker_id=job.worker_id,
                    started_at=job.last_attempted_at,
                    finished_at=now,
                    lease_renewed_at=max(lease.renewed_at, job.last_attempted_at) if job.last_attempted_at else lease.renewed_at,
                    error_class="backwave.results.LeaseLapsed",
                    traceback=_lapsed_text(job, lease, was_suspect=was_suspect),
                )
                _note(db, now, self.observed, job, job.attempts, "lapsed")  # the "noted" CTE
            settle_dependents(db, now, failed_for_good, self.observed)
            return len(released)

    # -- jobs ----------------------------------------------------------------------------------

    def claim_jobs(self, *, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Take up to ``limit`` due ready jobs of ``queues`` under a live lease, in claim order."""
        claim = claim_statement(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit, admitted=self.admitted_queues)
        if claim is None:
            return []
        with self._operation() as (db, now):
            return self._claim(db, now, claim)

    def write_outcomes_many(self, *, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> Applied:
        """Apply fenced outcomes and log one attempt per applied outcome; returns applied ids.
        A row whose data cannot be stored costs that row alone, as in PostgresStore."""
        if not outcomes:
            return Applied()
        return write_isolating(lambda records: self._write_outcomes(lease_id, records), outcomes)

    def write_outcomes_then_claim(
        self, *, lease_id: uuid.UUID, worker_id: str, outcomes: Sequence[OutcomeRecord], queues: Sequence[str], limit: int
    ) -> tuple[Applied, list[ClaimedJob]]:
        """Write outcomes, then claim, as one operation; the claim sees the write's effects."""

        def together(claim: tuple[str, dict[str, Any]]) -> tuple[Applied, list[ClaimedJob]]:
            rows, replaced = _outcome_rows(lease_id, outcomes)
            with self._operation() as (db, now):  # one transaction: both statements see one now()
                applied, released, busy = self._write(db, now, lease_id, rows, self.observed)
                self._note_outcomes(db, now, rows, applied)
                return _answer(applied, released, busy, replaced), self._claim(db, now, claim)

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

    def _write_outcomes(self, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> Applied:
        rows, replaced = _outcome_rows(lease_id, outcomes)
        with self._operation() as (db, now):
            applied, released, busy = self._write(db, now, lease_id, rows, self.observed)
            self._note_outcomes(db, now, rows, applied)
        return _answer(applied, released, busy, replaced)

    def _note_outcomes(self, db: MemoryDatabase, now: datetime, rows: list[dict[str, Any]], applied: set[int]) -> None:
        """write_outcomes_many's "noted" CTE: a transition per applied outcome observers watch."""
        for row in rows:
            if row["job_id"] in applied:
                kind = "retried" if row["kind"] == "retry" else row["kind"]
                _note(db, now, self.observed, db.jobs[row["job_id"]], row["attempt"], kind)

    # -- transition observers -------------------------------------------------------------------

    def claim_transitions(
        self, *, token: uuid.UUID, limit: int, lease: float, observers: Sequence[str] = (), deliverer: str | None = None
    ) -> list[TransitionRecord]:
        """Claim up to ``limit`` due transitions waiting for one of ``observers`` under ``token``
        for ``lease`` seconds, recording ``deliverer`` and those observers."""
        if limit <= 0:
            return []
        lease = lease_seconds(lease)
        registered = set(observers)
        with self._operation() as (db, now):
            if deliverer is not None:
                self._record_deliverer(db, now, deliverer, sorted(registered))
            due = sorted(
                (
                    t
                    for t in db.transitions.values()
                    if t.state == "pending" and t.next_attempt_at <= now and _waits_for_one_of(t, registered)
                ),
                key=lambda t: (t.next_attempt_at, t.id),
            )[:limit]
            claimed = []
            for row in due:
                row.claim_token = token
                row.deliveries += 1
                row.next_attempt_at = now + timedelta(seconds=lease)
                claimed.append(
                    TransitionRecord(
                        id=row.id,
                        job_id=row.job_id,
                        attempt=row.attempt,
                        kind=row.kind,
                        task_path=row.task_path,
                        queue=row.queue,
                        occurred_at=row.occurred_at,
                        deliveries=row.deliveries,
                        delivered_to=tuple(row.delivered_to),
                        observers=tuple(row.observers),
                    )
                )
            return sorted(claimed, key=lambda t: t.id)

    @staticmethod
    def _record_deliverer(db: MemoryDatabase, now: datetime, deliverer: str, observers: list[str]) -> None:
        """claim_transitions' "seen" and "forgotten" CTEs."""
        row = db.deliverers.get(deliverer)
        if row is None or row.seen_at < now - timedelta(seconds=10) or row.observers != observers:
            db.deliverers[deliverer] = DelivererRow(
                id=deliverer, hostname=socket.gethostname(), pid=os.getpid(), observers=observers, seen_at=now
            )
        for silent in [key for key, seen in db.deliverers.items() if seen.seen_at < now - timedelta(days=1)]:
            del db.deliverers[silent]

    def settle_transitions(self, *, token: uuid.UUID, results: Sequence[DeliveryResult]) -> set[int]:
        """Delete what was delivered, keep what failed (due later, or dead); fenced by ``token``."""
        if not results:
            return set()
        rows = json.loads(delivery_params(token, results)["results"])
        with self._operation() as (db, now):
            settled = set()
            for result in rows:
                row = db.transitions.get(result["id"])
                if row is None or row.claim_token != token or row.state != "pending":
                    continue
                settled.add(row.id)
                if result["failed_observer"] is None:
                    delivered = [*row.delivered_to, *result["delivered"]]
                    if set(row.observers) <= set(delivered):
                        del db.transitions[row.id]
                    else:  # the rest of its observers are another deliverer's
                        row.delivered_to, row.next_attempt_at, row.claim_token = delivered, now, None
                    continue
                row.delivered_to = [*row.delivered_to, *result["delivered"]]
                row.failed_observer = result["failed_observer"]
                row.last_error = result["error"]
                row.state = "dead" if result["dead"] else "pending"
                row.next_attempt_at = _later(now, max(result["retry_delay"], 0.0))
                row.claim_token = None
            return settled

    def forget_overruns(self, *, lease_id: uuid.UUID, attempts: Sequence[tuple[int, int]]) -> int:
        """Delete the lease's overruns of these (job id, attempt): their handlers returned."""
        if not attempts:
            return 0
        with self._operation() as (db, _now):
            forgotten = [
                key
                for key in dict.fromkeys((int(job_id), int(number)) for job_id, number in attempts)
                if (row := db.overruns.get(key)) is not None and row.lease_id == lease_id
            ]
            for key in forgotten:
                del db.overruns[key]
            return len(forgotten)

    def cancel_jobs(
        self, *, job_ids: Sequence[int], by: str, allowed: Sequence[str], observed: str = NOTHING_OBSERVED
    ) -> list[tuple[int, str, bool]]:
        """cancel_jobs in queries.sql (backwave/store/operator.py): of the jobs in an ``allowed``
        state, a job not running is cancelled at once (its dependents settled, its transition
        noted as ``observed`` says), a running one gets a cancel request (the first author
        stays) that its worker hears of. (id, state when locked, changed) per job that exists."""
        with self._operation() as (db, now):
            rows, settling = [], {}
            for job_id in sorted(set(job_ids)):
                job = db.jobs.get(job_id)
                if job is None:
                    continue
                state = job.state
                changed = state in allowed
                if changed:
                    if job.cancel_requested_at is None:
                        job.cancel_requested_by, job.cancel_requested_at = by, now
                    if state != "running":
                        job.state, job.finished_at, job.reason = "cancelled", now, ""
                        _note(db, now, observed, job, job.attempts, "cancelled")
                        settling[job_id] = "cancelled"
                rows.append((job_id, state, changed))
            settle_dependents(db, now, settling, observed)
            return rows

    def release_jobs_many(self, *, lease_id: uuid.UUID, job_ids: Sequence[int]) -> Released:
        """Give unfinished jobs back (ready, due now, attempt refunded), fenced like outcomes."""
        if not job_ids:
            return Released()
        with self._operation() as (db, now):
            if not _live(db, lease_id, now):
                return Released()
            released, busy = set(), set()
            for job_id in dict.fromkeys(job_ids):
                job = db.jobs.get(job_id)
                if job is not None and job.lease_id == lease_id and job.state == "running":
                    if job_id in db.held_rows:
                        busy.add(job_id)  # SKIP LOCKED: the pump sends it again
                        continue
                    _refund(job, now)
                    released.add(job_id)
            return Released(released, busy=busy)

    def reconcile_lease(self, *, lease_id: uuid.UUID, known: Sequence[tuple[int, int]]) -> Released:
        """Give back the jobs running under the lease at an attempt not in ``known``."""
        params = known_params(known)
        keep = set(zip(params["known_ids"], params["known_attempts"], strict=True))
        with self._operation() as (db, now):
            if not _live(db, lease_id, now):
                return Released()
            released, busy = set(), set()
            for job in db.jobs.values():
                if job.lease_id == lease_id and job.state == "running" and (job.id, job.attempts) not in keep:
                    if job.id in db.held_rows:
                        busy.add(job.id)  # SKIP LOCKED: the pump releases it later
                        continue
                    released.add((job.id, job.attempts))  # the attempt as it ran, before the refund
                    _refund(job, now)
            return Released(released, busy=busy)

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[int]:
        """Insert jobs in one operation; returns their ids in input order."""
        if not jobs:
            return []
        name, params = insert_statement(jobs, hint=False)
        rows = jsonb_input(params["jobs"], name)
        for row in rows:
            if not -_MAX_PRIORITY <= row["priority"] <= _MAX_PRIORITY:
                raise StoreError('enqueue_many failed [23514]: new row violates check constraint "backwave_job_priority_range"')
            if row["max_attempts"] < 1:
                raise StoreError(
                    'enqueue_many failed [23514]: new row violates check constraint "backwave_job_max_attempts_positive"'
                )
        with self._operation() as (db, now):
            # enqueue_with_dependencies' "refused": an ancestor missing, or ended badly under a
            # policy other than run. Nothing is inserted then.
            refused = {
                edge["job"]: (db.jobs[edge["job"]].state if edge["job"] in db.jobs else None)
                for row in rows
                for edge in row.get("after", ())
                if edge["job"] is not None
                and (edge["job"] not in db.jobs or (db.jobs[edge["job"]].state in _ENDED_BADLY and edge["on_failure"] != "run"))
            }
            if refused:
                raise DependencyRefused(dependency_refusal(refused), refused)
            # enqueue_unique_many's ON CONFLICT: the job holding a key is found, never a second one made.
            holders = {job.unique_key: job for job in db.jobs.values() if job.unique_key is not None}
            ids = []
            for row in rows:
                run_at = datetime.fromisoformat(row["run_at"]) if row["run_at"] is not None else now
                key = _stored_unique_key(row, now)
                if key is not None and key in holders:
                    held = holders[key]
                    replace = row.get("unique_replace") or ()
                    if held.state == "ready" and "args" in replace:
                        held.payload_json = json.dumps(row["payload"])
                    if held.state == "ready" and "run_at" in replace:
                        held.run_at = max(held.run_at, run_at)
                    ids.append(held.id)
                    continue
                waits = sum(
                    1 for edge in row.get("after", ()) if edge["pos"] is not None or db.jobs[edge["job"]].state not in _FINISHED
                )
                db.last_id += 1
                job = db.jobs[db.last_id] = JobRow(
                    id=db.last_id,
                    task_path=row["task_path"],
                    queue=row["queue"],
                    priority=row["priority"],
                    payload_json=json.dumps(row["payload"]),
                    state="waiting" if waits else "ready",
                    backend=row["backend"],
                    tags=list(row["tags"]),
                    run_at=run_at,
                    enqueued_at=now,
                    max_attempts=row["max_attempts"],
                    backoff_base=row["backoff_base"],
                    backoff_max=row["backoff_max"],
                    waiting_on=waits,
                    timeout=row["timeout"],
                    limit_key=row.get("limit_key"),
                    trace_context=row["trace_context"],
                    unique_states=list(row["unique_states"]) if key is not None else None,
                    unique_replace=list(row["unique_replace"]) if key is not None else None,
                    unique_key=key,
                )
                if key is not None:
                    holders[key] = job
                ids.append(db.last_id)
            for job_id, row in zip(ids, rows, strict=True):
                for position, edge in enumerate(row.get("after", ()), start=1):
                    ancestor = edge["job"] if edge["job"] is not None else ids[edge["pos"] - 1]
                    db.dependencies[(job_id, ancestor)] = (edge["on_failure"], position)
            return ids

    # -- maintenance: schedules, retention, pump health -----------------------------------------

    def sync_schedules(self, *, schedules: Sequence[ScheduleDefinition]) -> list[str]:
        """Write the declared schedules and disable the undeclared; returns the names disabled."""
        names = [d.name for d in schedules]
        if len(set(names)) != len(names):
            raise StoreError("sync_schedules failed [21000]: ON CONFLICT DO UPDATE command cannot affect row a second time")
        for d in schedules:
            if not -_MAX_PRIORITY <= d.priority <= _MAX_PRIORITY or d.max_attempts < 1:
                raise StoreError("sync_schedules failed [23514]: new row violates a check constraint of backwave_schedule")
        with self._operation() as (db, now):
            by_name = {row.name: row for row in db.schedules.values()}
            for d in schedules:
                fields = dict(
                    task_path=d.task_path,
                    cron=d.cron,
                    args=json.loads(json.dumps(list(d.args))),
                    kwargs=json.loads(json.dumps(dict(d.kwargs))),
                    queue=d.queue,
                    priority=d.priority,
                    max_attempts=d.max_attempts,
                    backoff_base=d.backoff_base,
                    backoff_max=d.backoff_max,
                    backend=d.backend,
                    tags=list(d.tags),
                    enabled=d.enabled,
                    timeout=d.timeout,
                    limit_key=d.limit_key,
                )
                row = by_name.get(d.name)
                if row is None:
                    db.last_schedule_id += 1
                    db.schedules[db.last_schedule_id] = ScheduleRow(
                        id=db.last_schedule_id, name=d.name, created_at=now, updated_at=now, **fields
                    )
                    continue
                # A changed expression, or a schedule disabled before or now: start afresh.
                keep = row.cron == d.cron and row.enabled and d.enabled
                for name, value in fields.items():
                    setattr(row, name, value)
                row.next_run = row.next_run if keep else None
                row.updated_at = now
            retired = sorted(row.name for row in by_name.values() if row.enabled and row.name not in names)
            for name in retired:
                row = by_name[name]
                row.enabled, row.next_run, row.updated_at = False, None, now
            return retired

    def due_schedules(self, *, limit: int) -> list[DueSchedule]:
        """Enabled schedules with a slot due (or next_run unknown), with the database's now()."""
        with self._operation() as (db, now):
            due = [row for row in db.schedules.values() if row.enabled and (row.next_run is None or row.next_run <= now)]
            due.sort(key=lambda row: (row.next_run is not None, row.next_run or now, row.id))  # NULLS FIRST
            return [
                DueSchedule(id=row.id, name=row.name, cron=row.cron, next_run=row.next_run, db_now=now)
                for row in due[: max(limit, 0)]
            ]

    def mint_schedules_many(self, *, slots: Sequence[ScheduleSlot]) -> list[int]:
        """Mint each still-due slot as one job and move next_run on; returns the minted job ids."""
        if not slots:
            return []
        with self._operation() as (db, now):
            taken = {(job.schedule_id, job.schedule_slot) for job in db.jobs.values() if job.schedule_id is not None}
            locked = [
                (db.schedules[s.schedule_id], s)
                for s in slots
                if s.schedule_id in db.schedules
                and (row := db.schedules[s.schedule_id]).enabled
                and row.cron == s.cron
                and (row.next_run is None or row.next_run <= now)
            ]
            minted = []
            for row, s in locked:
                if s.slot is None or (row.last_slot is not None and s.slot <= row.last_slot) or (row.id, s.slot) in taken:
                    continue  # nothing to mint, an older slot, or ON CONFLICT DO NOTHING
                db.last_id += 1
                db.jobs[db.last_id] = JobRow(
                    id=db.last_id,
                    task_path=row.task_path,
                    queue=row.queue,
                    priority=row.priority,
                    payload_json=json.dumps({"args": row.args, "kwargs": row.kwargs}),
                    state="ready",
                    backend=row.backend,
                    tags=list(row.tags),
                    run_at=s.slot,
                    enqueued_at=now,
                    max_attempts=row.max_attempts,
                    backoff_base=row.backoff_base,
                    backoff_max=row.backoff_max,
                    schedule_id=row.id,
                    schedule_slot=s.slot,
                    timeout=row.timeout,
                    limit_key=row.limit_key,
                )
                taken.add((row.id, s.slot))
                minted.append(db.last_id)
            for row, s in locked:
                if s.slot is not None:  # greatest() ignores NULLs
                    row.last_slot = s.slot if row.last_slot is None else max(row.last_slot, s.slot)
                row.next_run = s.next_run
            return sorted(minted)

    def purge_jobs(self, *, older_than: Sequence[tuple[str, float]], limit: int) -> int:
        """Delete up to ``limit`` finished jobs past their state's retention; returns how many."""
        if limit <= 0 or not older_than:
            return 0
        with self._operation() as (db, now):
            # Not before its attempts are in the task statistics (see roll_up_task_stats).
            unrolled = {row.job_id for row in db.attempts_after(db.stats_watermark)}
            doomed: list[int] = []
            unfinished = ("waiting", "held", "ready", "running")
            # An ancestor stays while a dependent of it may still run (the NOT EXISTS).
            kept = {
                ancestor for (job_id, ancestor) in db.dependencies if job_id in db.jobs and db.jobs[job_id].state in unfinished
            }
            for state, seconds in older_than:  # one ordered scan per state, oldest first
                cutoff = now - timedelta(seconds=float(seconds))
                old = [
                    j
                    for j in db.jobs.values()
                    if j.state == state
                    and state in _FINISHED
                    and j.finished_at is not None
                    and j.finished_at < cutoff
                    and j.id not in unrolled
                    and j.id not in kept
                ]
                doomed += [j.id for j in sorted(old, key=lambda j: j.finished_at)[:limit]]
            doomed = doomed[:limit]
            for job_id in doomed:
                del db.jobs[job_id]
            gone = set(doomed)
            for key in [key for key in db.attempts if key[0] in gone]:  # ON DELETE CASCADE
                del db.attempts[key]
            for key in [key for key in db.dependencies if key[0] in gone or key[1] in gone]:
                del db.dependencies[key]
            return len(doomed)

    def roll_up_task_stats(self, *, limit: int, settle: float = ROLLUP_SETTLE) -> int:
        """Fold up to ``limit`` finished attempts into the per-task statistics; returns how many.

        Two-phase as the statement is: a run rolls up to the horizon the run before took (here
        every transaction has always ended: there are none), and takes a new one once caught up."""
        if limit <= 0:
            return 0
        with self._operation() as (db, now):
            page = [row for row in db.attempts_after(db.stats_watermark) if row.id <= db.stats_horizon][:limit]
            for row in page:
                job = db.jobs[row.job_id]
                outcome = row.state
                if row.state == "failed":
                    outcome = "failed" if job.state == "failed" and job.attempts == row.number else "retried"
                duration = None
                if row.state != "lapsed" and row.started_at is not None:
                    duration = max((row.finished_at - row.started_at).total_seconds(), 0.0)
                for resolution in taskstats.RESOLUTIONS:
                    epoch = row.finished_at.timestamp()
                    bucket = datetime.fromtimestamp(math.floor(epoch / resolution) * resolution, UTC)
                    summary = db.task_stats.setdefault((resolution, bucket, job.task_path), TaskSummary(task_path=job.task_path))
                    summary.add(
                        **{outcome: 1},
                        reruns=int(row.number > 1),
                        timed=int(duration is not None),
                        duration_sum=duration or 0.0,
                        duration_max=duration or 0.0,
                        histogram={taskstats.bin_of(duration): 1} if duration is not None else None,
                    )
            if len(page) == limit:
                db.stats_watermark = page[-1].id
            else:
                db.stats_watermark = db.stats_horizon
                db.stats_horizon = db.last_attempt_id
            db.stats_rolled_at = now
            return len(page)

    def record_pumps_many(self, *, pumps: Sequence[PumpHealth]) -> None:
        """Upsert each pump's health row, last_heartbeat_at = now()."""
        if not pumps:
            return
        with self._operation() as (db, now):
            for p in pumps:
                row = db.pumps.get(p.worker_id)
                if row is None:
                    db.pumps[p.worker_id] = PumpRow(
                        worker_id=p.worker_id,
                        group=p.group,
                        hostname=p.hostname,
                        pid=p.pid,
                        status=p.status,
                        reason=clean_text(p.reason),
                        in_flight=p.in_flight,
                        lease_duration=float(p.lease_duration),
                        started_at=now,
                        last_heartbeat_at=now,
                        queues=list(p.queues),
                    )
                else:
                    row.status, row.reason, row.in_flight, row.queues = (
                        p.status,
                        clean_text(p.reason),
                        p.in_flight,
                        list(p.queues),
                    )
                    row.lease_duration, row.last_heartbeat_at = float(p.lease_duration), now

    def forget_pumps_many(self, *, worker_ids: Sequence[str]) -> int:
        """Delete these pumps' health rows; returns how many there were."""
        if not worker_ids:
            return 0
        with self._operation() as (db, _now):
            gone = [worker_id for worker_id in dict.fromkeys(worker_ids) if worker_id in db.pumps]
            for worker_id in gone:
                del db.pumps[worker_id]
            return len(gone)

    def unserved_queues(self) -> list[tuple[str, float]]:
        """Queues with a due ready job that no live pump serves, and how long it waited (see the contract)."""
        with self._operation() as (db, now):
            live = {lease.worker_id for lease in db.leases.values() if lease.expires_at > now}
            served = {
                queue for pump in db.pumps.values() if pump.status != "halted" and pump.worker_id in live for queue in pump.queues
            }
            oldest: dict[str, datetime] = {}
            for job in db.jobs.values():
                if (
                    job.state == "ready"
                    and job.run_at <= now
                    and job.queue not in served
                    and not db.queues.get(job.queue, (None, False))[1]
                ):
                    oldest[job.queue] = min(oldest.get(job.queue, job.run_at), job.run_at)
            return [(queue, (now - oldest[queue]).total_seconds()) for queue in sorted(oldest)]

    def refresh_statistics(self) -> list[str]:
        """No planner here, so no statistics to fall behind: nothing to analyze."""
        return []

    def purge_pumps(self, *, older_than: float) -> int:
        """Delete health rows silent for more than ``older_than`` seconds; returns how many."""
        with self._operation() as (db, now):
            cutoff = now - timedelta(seconds=float(older_than))
            gone = [row.worker_id for row in db.pumps.values() if row.last_heartbeat_at < cutoff]
            for worker_id in gone:
                del db.pumps[worker_id]
            return len(gone)

    def purge_task_stats(self, *, older_than: Sequence[tuple[int, float]], limit: int) -> int:
        """Delete up to ``limit`` statistics buckets past their resolution's retention."""
        if not older_than or limit < 1:
            return 0
        with self._operation() as (db, now):
            cutoffs = {int(resolution): now - timedelta(seconds=float(seconds)) for resolution, seconds in older_than}
            gone = [key for key in sorted(db.task_stats) if key[0] in cutoffs and key[1] < cutoffs[key[0]]][:limit]
            for key in gone:
                del db.task_stats[key]
            return len(gone)

    # -- connection ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close this store; later calls raise StoreError. The database lives on."""
        self._closed = True

    def __enter__(self) -> InMemoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the statements ------------------------------------------------------------------------

    def _operation(self):
        if self._closed:
            raise StoreError("this InMemoryStore is closed; build a new one")
        self.round_trips += 1
        return _Operation(self.database)

    @staticmethod
    def _claim(db: MemoryDatabase, now: datetime, claim: tuple[str, dict[str, Any]]) -> list[ClaimedJob]:
        name, params = claim
        admitted = name == "claim_jobs_admitted"
        lease_id = params["lease_id"]
        if not _live(db, lease_id, now):  # the lease CTE: no claim under a lapsed or missing lease
            return []
        order = [params["queue"]] if "queue" in params else list(params["queues"])
        position = {queue: index for index, queue in enumerate(order)}
        room = {queue: _room(db, queue, params["limit"], admitted=admitted, now=now) for queue in order}
        # Handlers that outlived their attempt count where their running rows did.
        overruns = db.live_overruns(now) if db.overruns else ()
        admissions = {queue: db.admission.get(queue, NO_ADMISSION) if admitted else NO_ADMISSION for queue in order}
        running_keys: dict[tuple[str, str], int] = {}
        for job in db.jobs.values():
            if job.state == "running" and job.limit_key is not None:
                running_keys[job.queue, job.limit_key] = running_keys.get((job.queue, job.limit_key), 0) + 1
        for row in overruns:
            if row.limit_key is not None:
                running_keys[row.queue, row.limit_key] = running_keys.get((row.queue, row.limit_key), 0) + 1
        windows = {
            queue: rate_window_start(now, admission.rate_period)
            for queue, admission in admissions.items()
            if admission.rate_period is not None
        }

        def key_room(queue: str, key: str) -> int | None:
            """What the key may still start: its concurrency room and what is left of its rate
            window, the lesser (None: the key is not limited)."""
            admission, rooms = admissions[queue], []
            if admission.key_concurrency_limit is not None:
                rooms.append(admission.key_concurrency_limit - running_keys.get((queue, key), 0))
            if admission.key_rate_limit is not None:
                start, used = db.key_rate_windows.get((queue, key), (None, 0))
                rooms.append(admission.key_rate_limit - (used if start == windows[queue] else 0))
            return min(rooms) if rooms else None

        def saturated(job: JobRow) -> bool:
            if job.limit_key is None:
                return False
            room = key_room(job.queue, job.limit_key)
            return room is not None and room <= 0

        due = [
            job
            for job in db.jobs.values()
            if job.state == "ready" and job.queue in position and job.run_at <= now and not saturated(job)
        ]

        def claim_order(job: JobRow) -> tuple:
            return (position[job.queue], -job.priority, job.run_at, job.id)

        # The suspect CTE: at most one suspect (the best of each queue's first, in claim order),
        # none while this lease already runs one, and only from a queue with room.
        runs_a_suspect = any(job.lease_id == lease_id and job.state == "running" and job.suspect for job in db.jobs.values())
        suspects = (
            [] if runs_a_suspect else sorted((job for job in due if job.suspect and room[job.queue] > 0), key=claim_order)[:1]
        )
        # Queue order first (a Strict policy's), then priority, run_at, id; each queue up to its
        # room (paused: none; limited: the limit less what runs), the suspect merged into its
        # queue's pick before the cut; handed back best first.
        ordinary = sorted((job for job in due if not job.suspect), key=claim_order)
        if admitted:
            # claim_jobs_admitted's "candidates": per queue the first room (four times the room
            # under a per-key limit) of the unsaturated rows, then "within_key": each key cut to
            # its limit less what runs.
            fetched: dict[str, int] = {}
            window = []
            for job in ordinary:
                keyed = (
                    admissions[job.queue].key_concurrency_limit is not None or admissions[job.queue].key_rate_limit is not None
                )
                cap = room[job.queue] * (4 if keyed else 1)
                if fetched.get(job.queue, 0) < cap:
                    fetched[job.queue] = fetched.get(job.queue, 0) + 1
                    window.append(job)
            taken: dict[tuple[str, str], int] = {}
            kept = []
            for job in sorted(window + suspects, key=claim_order):
                allowed = key_room(job.queue, job.limit_key) if job.limit_key is not None else None
                if allowed is not None:
                    slot = (job.queue, job.limit_key)
                    if taken.get(slot, 0) >= allowed:
                        continue
                    taken[slot] = taken.get(slot, 0) + 1
                kept.append(job)
            candidates = kept
        else:
            candidates = sorted(ordinary + suspects, key=claim_order)
        picked = []
        for job in candidates:
            if len(picked) == params["limit"]:
                break
            if room[job.queue] > 0:
                room[job.queue] -= 1
                picked.append(job)
        if admitted:
            # "debited": the rate windows of the queues that started jobs; "key_debited" and
            # "key_expired": the claimed keys' windows, and the past windows of the others.
            for queue in {job.queue for job in picked}:
                if admissions[queue].rate_limit is not None:
                    start = windows[queue]
                    held, used = db.rate_windows.get(queue, (None, 0))
                    db.rate_windows[queue] = (
                        start,
                        (used if held == start else 0) + sum(1 for job in picked if job.queue == queue),
                    )
            for queue in order:
                if admissions[queue].key_rate_limit is None:
                    continue
                start = windows[queue]
                claimed_keys = Counter(job.limit_key for job in picked if job.queue == queue and job.limit_key is not None)
                for key, started in claimed_keys.items():
                    held, used = db.key_rate_windows.get((queue, key), (None, 0))
                    db.key_rate_windows[queue, key] = (start, (used if held == start else 0) + started)
                for slot, (held, _) in list(db.key_rate_windows.items()):
                    if slot[0] == queue and held < start and slot[1] not in claimed_keys:
                        del db.key_rate_windows[slot]
        picked.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        claimed = []
        for job in picked:
            job.state = "running"
            job.lease_id = lease_id
            job.worker_id = params["worker_id"]
            job.attempts += 1
            job.last_attempted_at = now
            if job.started_at is None:
                job.started_at = now
            earlier = ()
            if job.attempts > 1:  # a first attempt has no history
                earlier = tuple(row.worker_id for key, row in sorted(db.attempts.items()) if key[0] == job.id)
            claimed.append(
                ClaimedJob(
                    id=job.id,
                    task_path=job.task_path,
                    queue=job.queue,
                    priority=job.priority,
                    payload=job.payload,
                    attempt=job.attempts,
                    max_attempts=job.max_attempts,
                    backoff_base=job.backoff_base,
                    backoff_max=job.backoff_max,
                    backend=job.backend,
                    enqueued_at=job.enqueued_at,
                    started_at=job.started_at,
                    attempted_at=job.last_attempted_at,
                    previous_worker_ids=earlier,
                    forgiven_attempts=job.forgiven_attempts,
                    suspect=job.suspect,
                    trace_context=job.trace_context,
                    timeout=job.timeout,
                    cancel_requested_by=job.cancel_requested_by if job.cancel_requested_at is not None else None,
                )
            )
        return claimed

    @staticmethod
    def _write(
        db: MemoryDatabase, now: datetime, lease_id: uuid.UUID, rows: list[dict[str, Any]], observed: str
    ) -> tuple[set[int], int, set[int]]:
        """The applied ids, how many dependents were made ready, and the busy ids (held rows)."""
        # The %(outcomes)s::jsonb cast: the server reads the whole batch before the fence.
        for row in rows:
            # A side channel the attempt did not use is left out of its row (NULL in jsonb_to_recordset).
            for value in (row["boxed"], row.get("output"), row.get("progress"), row.get("metadata")):
                if value is not None and (refusal := _jsonb_refusal(value)):
                    raise _refused(*refusal)
        if not _live(db, lease_id, now):
            return set(), 0, set()
        # The fence: this lease's token, still running, at this attempt. Checked for the whole
        # batch before anything changes, as one statement either applies or fails as a whole.
        applied = []
        busy = set()
        for row in rows:
            job = db.jobs.get(row["job_id"])
            if job is not None and job.lease_id == lease_id and job.state == "running" and job.attempts == row["attempt"]:
                if job.id in db.held_rows or (db.held_rows and row["kind"] not in _AGAIN and _holds_a_dependent(db, job.id)):
                    busy.add(job.id)  # SKIP LOCKED: written again later, the rest lands now
                    continue
                if (job.id, row["attempt"]) in db.attempts:
                    raise StoreError(
                        'write_outcomes_many failed [23505]: duplicate key value violates unique constraint "backwave_attempt_once"',
                        sqlstate="23505",
                        statement="write_outcomes_many",
                    )
                kind = row["kind"]
                run_at = _later(now, row["retry_delay"]) if kind in _AGAIN else job.run_at
                finished_at = _later(job.last_attempted_at or now, row["duration"])
                applied.append((job, row, run_at, finished_at))
        for job, row, run_at, finished_at in applied:
            kind = row["kind"]
            value = None if row["boxed"] is None else json.dumps(row["boxed"].get("v"))
            job.state = _TERMINAL_STATE[kind]
            job.run_at = run_at
            job.finished_at = None if kind in _AGAIN else now
            job.forgiven_attempts += 1 if kind == "snoozed" else 0
            job.return_value_json = value
            _report(job, row)
            job.lease_id = None
            job.suspect = False  # the attempt ended without taking its worker down
            if row.get("output") is not None:  # coalesce(j.output, '{}') || o.output
                job.output_json = json.dumps({**(job.output or {}), **row["output"]})
            if row.get("tag_add") is not None or row.get("tag_remove") is not None:
                removed = set(row.get("tag_remove") or ())
                job.tags = [tag for tag in dict.fromkeys([*job.tags, *(row.get("tag_add") or ())]) if tag not in removed]
            db.attempts[(job.id, row["attempt"])] = AttemptRow(
                id=db.next_attempt_id(),
                job_id=job.id,
                number=row["attempt"],
                state=_ATTEMPT_STATE[kind],
                worker_id=job.worker_id,
                started_at=job.last_attempted_at,
                finished_at=finished_at,
                error_class=row["error_class"],
                traceback=row["traceback"],
                return_value_json=value,
            )
            if row.get("overrun"):  # the "overran" CTE
                db.overruns[(job.id, row["attempt"])] = OverrunRow(
                    lease_id=lease_id, queue=job.queue, limit_key=job.limit_key, since=now
                )
        settling = {job.id: _ATTEMPT_STATE[row["kind"]] for job, row, *_ in applied if row["kind"] not in _AGAIN}
        return {job.id for job, *_ in applied}, settle_dependents(db, now, settling, observed), busy


class _Operation:
    """Holds the database lock for one operation and reads the clock once."""

    __slots__ = ("_db",)

    def __init__(self, db: MemoryDatabase):
        self._db = db

    def __enter__(self) -> tuple[MemoryDatabase, datetime]:
        self._db.lock.acquire()
        try:
            return self._db, self._db.now()
        except BaseException:
            self._db.lock.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self._db.lock.release()


def settle_dependents(db: MemoryDatabase, now: datetime, settling: dict[int, str], observed: str) -> int:
    """settle_dependents in queries.sql: what the jobs ``settling`` ends (id -> new state) do to
    their dependents, a cancelled one noted as ``observed`` says (dep_noted); returns how many
    were made ready. Also what the admin's cancel does."""
    if not settling or not db.dependencies:
        return 0
    dependents: dict[int, list[tuple[int, str]]] = {}  # ancestor -> [(dependent, on_failure)]
    for (job_id, ancestor_id), (on_failure, _position) in db.dependencies.items():
        dependents.setdefault(ancestor_id, []).append((job_id, on_failure))

    def open_dependent(job_id: int) -> bool:
        return job_id not in settling and db.jobs[job_id].state in ("waiting", "held")

    # dep_doomed: "cancel" dependents of the failed, transitively; the smallest ancestor is the cause.
    doomed: dict[int, int] = {}
    frontier = [ancestor for ancestor, state in settling.items() if state != "succeeded"]
    while frontier:
        reached = []
        for ancestor in frontier:
            for job_id, on_failure in dependents.get(ancestor, ()):
                if on_failure == "cancel" and open_dependent(job_id):
                    if job_id not in doomed:
                        reached.append(job_id)
                    doomed[job_id] = min(doomed.get(job_id, ancestor), ancestor)
        frontier = reached
    ended = {**settling, **dict.fromkeys(doomed, "cancelled")}
    satisfied: dict[int, int] = {}
    held_by: dict[int, int] = {}
    for ancestor, state in ended.items():
        for job_id, on_failure in dependents.get(ancestor, ()):
            if job_id in settling:
                continue
            satisfied.setdefault(job_id, 0)
            if state == "succeeded" or on_failure == "run":
                satisfied[job_id] += 1
            elif on_failure == "hold":
                held_by[job_id] = min(held_by.get(job_id, ancestor), ancestor)
    made_ready = 0
    for job_id, count in satisfied.items():
        job = db.jobs[job_id]
        if job.state not in ("waiting", "held"):
            continue
        left = job.waiting_on - count
        was = job.state
        job.waiting_on = max(left, 0)
        if job_id in doomed:
            job.state, job.finished_at = "cancelled", now
            job.reason = f"Cancelled: ancestor #{doomed[job_id]}{_ended_words(ended[doomed[job_id]])}."
            _note(db, now, observed, job, job.attempts, "cancelled")
        elif was == "held" or job_id in held_by:
            job.state = "held"
            if was == "waiting":
                cause = held_by[job_id]
                job.reason = (
                    f"Held: ancestor #{cause}{_ended_words(ended[cause])}. "
                    "Retry it to re-arm this job, retry this job to run it now, or cancel it."
                )
        elif left <= 0:
            job.state, job.run_at = "ready", max(job.run_at, now)
            made_ready += 1
    return made_ready


def _holds_a_dependent(db: MemoryDatabase, ancestor_id: int) -> bool:
    """write_outcomes_many's "dependents_taken": whether another transaction holds an open
    direct dependent of the ancestor, which settling it would have to update."""
    return any(
        ancestor == ancestor_id and job_id in db.held_rows and db.jobs[job_id].state in ("waiting", "held")
        for job_id, ancestor in db.dependencies
    )


def _answer(applied: set[int], released: int, busy: set[int], replaced: dict) -> Applied:
    """An outcome write's answer as write_outcomes_many's rows make it (busy rows apart)."""
    rows = [(job_id, released, False) for job_id in applied] + [(job_id, 0, True) for job_id in busy]
    return applied_from_rows(rows, replaced)


def _ended_words(state: str) -> str:
    return " failed" if state == "failed" else f" was {state}"


def _live(db: MemoryDatabase, lease_id: uuid.UUID, now: datetime) -> bool:
    lease = db.leases.get(lease_id)
    return lease is not None and lease.expires_at > now


def _report(job: JobRow, row: dict[str, Any]) -> None:
    """An attempt's progress and metadata onto its job; None keeps what the row holds."""
    if row.get("progress") is not None:
        job.progress_json = json.dumps(row["progress"])
    if row.get("metadata") is not None:
        job.metadata_json = json.dumps(row["metadata"])


def _refund(job: JobRow, now: datetime) -> None:
    """release_lease / release_jobs_many: ready at once, the attempt given back."""
    first = job.attempts <= 1
    job.state = "ready"
    job.lease_id = None
    job.run_at = now
    job.attempts = max(job.attempts - 1, 0)
    if first:
        job.started_at = None


def _outcome_rows(
    lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]
) -> tuple[list[dict[str, Any]], dict[int, OutcomeRecord]]:
    """The batch exactly as write_outcomes_many's SQL receives it (validated, and its unencodable
    records replaced, the same way), and those replacements."""
    params, replaced = outcome_batch(lease_id, outcomes)
    return json.loads(params["outcomes"]), replaced


def _jsonb_refusal(value: Any) -> tuple[str, str] | None:
    """(SQLSTATE, message) of what PostgreSQL's jsonb input refuses in this decoded value: a lone
    surrogate (json.loads gives one back from its escape) or a number past numeric's digits."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            texts = [item]
        elif isinstance(item, dict):
            texts = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            texts = []
            stack.extend(item)
        else:
            if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > NUMERIC_MAX_DIGITS * _LOG2_10:
                return "22003", "value overflows numeric format"
            continue
        for text in texts:
            if (problem := text_problem(text)) and "surrogate" in problem:
                return "22P02", "invalid input syntax for type json\nDETAIL:  Unicode low surrogate must follow a high surrogate."
    return None


def _later(moment: datetime, seconds: float) -> datetime:
    """``moment + make_interval(secs => greatest(seconds, 0))``, or timestamptz's 22008 (Python's
    datetime ends at year 9999, PostgreSQL's at 294276: the in-memory store refuses sooner)."""
    try:
        return moment + timedelta(seconds=max(seconds or 0.0, 0.0))
    except OverflowError:
        raise _refused("22008", "timestamp out of range") from None


def _refused(sqlstate: str, message: str) -> StoreError:
    return StoreError(f"write_outcomes_many failed [{sqlstate}]: {message}", sqlstate=sqlstate, statement="write_outcomes_many")


def jsonb_input(document: str, operation: str) -> Any:
    """``document`` as a ``%s::jsonb`` parameter reaches PostgreSQL, or the error it meets there.

    psycopg encodes the text as UTF-8 first, so a raw lone surrogate raises UnicodeEncodeError
    (a ValueError) in the client. The server's jsonb input then refuses the tokens NaN and
    Infinity and an escaped lone surrogate (22P02), and a \\u0000 escape (22P05), which Python's
    json module all accept; a valid surrogate pair is one character to both.
    """
    document.encode("utf-8")
    try:
        value = json.loads(document, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise _refused_input(operation, "22P02", f"invalid input syntax for type json\nDETAIL:  {error.msg}.") from None
    except _RefusedToken as token:
        raise _refused_input(
            operation, "22P02", f'invalid input syntax for type json\nDETAIL:  Token "{token}" is invalid.'
        ) from None
    for text in _strings(value):
        if problem := text_problem(text):  # json.loads joins an escaped pair: a surrogate left was alone
            if "surrogate" in problem:
                raise _refused_input(
                    operation,
                    "22P02",
                    "invalid input syntax for type json\nDETAIL:  Unicode low surrogate must follow a high surrogate.",
                )
            raise _refused_input(
                operation, "22P05", "unsupported Unicode escape sequence\nDETAIL:  \\u0000 cannot be converted to text."
            )
    return value


def _refused_input(operation: str, sqlstate: str, message: str) -> StoreError:
    return StoreError(f"{operation} failed [{sqlstate}]: {message}", sqlstate=sqlstate, statement=operation)


class _RefusedToken(Exception):
    pass


def _refuse_constant(token: str):
    raise _RefusedToken(token)


def _strings(value: Any):
    """Every string of a decoded JSON document, object keys included, in document order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _pg_text(moment: datetime) -> str:
    """A timestamptz as PostgreSQL prints it in a UTC session (``::text``)."""
    moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "+00"


def _lapsed_text(job: JobRow, lease: LeaseRow, *, was_suspect: bool) -> str:
    """expire_leases' attempt text, for the job as it is after the lapse."""
    head = (
        f"backwave.results.LeaseLapsed: the lease of worker {lease.worker_id} expired at {_pg_text(lease.expires_at)}"
        " (database clock) without being renewed, so this attempt's outcome was never written; the worker died,"
        " hung or lost its database connection. "
    )
    if not was_suspect:
        return head + (
            f"Attempt {job.attempts} is not counted against max_attempts: every job under that lease lapsed with it,"
            " and this one may only have been running beside the cause. The job is ready to run again, never beside"
            " another such job on one pump."
        )
    return head + (
        f"Attempt {job.attempts} counts ({job.attempts - job.forgiven_attempts} of {job.max_attempts}): the job was"
        " already suspect (its previous attempt lapsed too) and ran as the only suspect of its pump; "
        + ("the job is ready to run again." if job.state == "ready" else "no attempts left, the job failed.")
    )

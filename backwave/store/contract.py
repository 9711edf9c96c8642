"""The Storage Contract: every database operation the engine performs, one method each.

Each method is one SQL statement (one round-trip); batch methods take sequences and are named
``*_many``. Methods that change rows under a lease return the ids they really changed: an id
missing from the answer means the writer no longer held that row's lease, which the driver treats
as an event, not a crash.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from backwave.core.jobs import ClaimedJob, OutcomeKind


# Seconds after which the rollup's horizon counts as settled even while some transaction that was
# running when it was taken is still open (a long report elsewhere in the cluster).
ROLLUP_SETTLE = 300.0


class StoreError(Exception):
    """A store operation failed in a way the shell cannot classify as transient.

    ``sqlstate`` is the server's error code when the server answered one, and ``statement`` the
    name of the statement it refused (a pipelined operation runs several).
    """

    def __init__(self, message: str = "", *, sqlstate: str | None = None, statement: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.statement = statement


class TransientStoreError(StoreError):
    """Connection lost, server restarting, serialization failure, lock or statement timeout:
    the pump marks itself degraded and retries on a later tick."""


DEPENDENCY_POLICIES = ("cancel", "run", "hold")


@dataclass(frozen=True, slots=True, kw_only=True)
class After:
    """One ancestor of a new job: an existing job (``job_id``) or the job at ``position`` (0-based)
    of the same enqueue batch, and what the dependent does if that ancestor fails, is cancelled
    or quarantined (``on_failure``: cancel, run or hold)."""

    job_id: int | None = None
    position: int | None = None
    on_failure: str = "cancel"


class DependencyRefused(StoreError):
    """An enqueue named ancestors that do not exist or that already ended badly; nothing was
    written. ``refused`` maps each such ancestor id to its state (None: no such job)."""

    def __init__(self, message: str, refused: dict[int, str | None]):
        super().__init__(message, statement="enqueue_with_dependencies")
        self.refused = refused


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """A job to insert. Validated by the caller (the tasks backend) before it gets here."""

    task_path: str
    payload: dict[str, Any]
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None  # None: due at once (database clock)
    max_attempts: int = 1
    backoff_base: float = 1.0
    backoff_max: float = 3600.0
    backend: str = "default"
    tags: Sequence[str] = field(default_factory=tuple)
    after: Sequence[After] = ()  # its ancestors: the job waits until every one has succeeded
    timeout: float | None = None  # seconds one attempt may run; None: no limit
    # The enqueue's W3C trace context ({"traceparent": ..., "tracestate": ...}), or None: the
    # attempt's span is its child (backwave/tracing.py).
    trace_context: Mapping[str, str] | None = None
    # Per-key concurrency: the key the queue's key_concurrency_limit counts by.
    limit_key: str | None = None
    # Uniqueness (see enqueue_unique_many): the key (the task path is put in front), the period
    # whose windows it holds for (None: for as long as the job is in a covered state), the states
    # it covers (always including ready) and what a duplicate replaces ('args', 'run_at').
    unique_key: str | None = None
    unique_period: float | None = None
    unique_states: Sequence[str] = ()
    unique_replace: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Inserted:
    """What an enqueue did with one job: its id (the existing job's, for a duplicate), its state
    and stored enqueued_at, and for a duplicate the payload, times and reason of the job it found
    (for the TaskResult handed back)."""

    id: int
    duplicate: bool = False
    state: str = "ready"
    payload: Any = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    last_attempted_at: datetime | None = None
    finished_at: datetime | None = None
    reason: str = ""


@dataclass(slots=True, kw_only=True)  # not frozen, one a job: see backwave.core.jobs.ClaimedJob
class OutcomeRecord:
    """An outcome as written: the driver's verdict plus the shell's side channel."""

    job_id: int
    attempt: int
    kind: OutcomeKind
    retry_delay: float | None = None
    return_value: Any = None  # JSON-able; SUCCEEDED only
    error_class: str = ""
    traceback: str = ""
    duration: float = 0.0  # seconds the attempt ran, measured on the worker's monotonic clock
    # The attempt's side channels, whatever its kind: Job Output recorded (merged into the job's)
    # and runtime tag deltas. None / empty: nothing to change.
    output: dict[str, Any] | None = None
    tags_added: tuple[str, ...] = ()
    tags_removed: tuple[str, ...] = ()
    # The attempt's last context.set_progress() and context.metadata (JSON-able, checked inside
    # the attempt); None: not set, the row keeps what it holds.
    progress: Any = None
    metadata: Any = None
    # The worker ended the attempt without its handler (a time limit, a cancel's grace), which
    # still runs: applied, it leaves an overrun under the lease (see forget_overruns).
    overrun: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressReport:
    """What a running attempt reported since the last heartbeat (see Store.heartbeat)."""

    job_id: int
    attempt: int
    progress: Any = None  # None: not set since the last heartbeat
    metadata: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """What a heartbeat answered: whether the lease is still held, the cancels requested of
    jobs running under it (job id -> who asked), and the jobs whose reports it could not write
    because another transaction held their rows (``busy``: send those again next time)."""

    held: bool
    cancels: dict[int, str] = field(default_factory=dict)
    busy: frozenset[int] = frozenset()


class Applied(set):
    """What an outcome write returns: the ids of the jobs whose outcome the fence let through.

    ``replaced`` maps each of those whose record could not be stored as given to the record
    written in its place: a failed attempt with error class backwave.UnstorableResult and a text
    saying why (see write_outcomes_many). ``busy`` are the ids the write passed over because
    another transaction held their job's row (or changed it while the write ran): neither
    applied nor refused, to be sent again.
    """

    def __init__(self, ids=(), replaced: dict[int, OutcomeRecord] | None = None, released: int = 0, busy: Iterable[int] = ()):
        super().__init__(ids)
        self.replaced: dict[int, OutcomeRecord] = dict(replaced or {})
        self.released = released  # dependents the write made ready (their last ancestor succeeded)
        self.busy = frozenset(busy)

    def joined(self, other: Applied) -> Applied:
        """Both writes' answers as one (each outcome went in one of them)."""
        return Applied(
            self | other,
            {**self.replaced, **other.replaced},
            released=self.released + other.released,
            busy=(self.busy | other.busy) - (self | other),
        )


class Released(set):
    """What release_jobs_many and reconcile_lease return: what they gave back, and ``busy``, the
    ids of the jobs they passed over because another transaction held their rows (still running
    under the lease, held by no one: the caller gives them back again later)."""

    def __init__(self, given=(), busy: Iterable[int] = ()):
        super().__init__(given)
        self.busy = frozenset(busy)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransitionRecord:
    """A transition row as claim_transitions returns it, claimed for one delivery pass."""

    id: int
    job_id: int
    attempt: int
    kind: str  # succeeded, failed, retried, cancelled, quarantined, lapsed
    task_path: str
    queue: str
    occurred_at: datetime
    deliveries: int  # tries so far, this one included
    delivered_to: tuple[str, ...] = ()  # observers that already ran for it
    # The observers it was noted for, by name (empty: noted by a writer that named none, for
    # whichever observers of the claimer match it).
    observers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryResult:
    """What one delivery pass did for one claimed transition (settle_transitions)."""

    id: int
    delivered: tuple[str, ...] = ()  # observers that ran without raising in this pass
    failed_observer: str | None = None  # None: every observer of it has now run
    error: str = ""
    retry_delay: float = 0.0
    dead: bool = False


# No observer watches anything: the outcome statements note no transition.
NOTHING_OBSERVED = "[]"

# When refresh_statistics analyzes a table: more rows changed since its last analysis than this
# many plus this share of its rows (autovacuum's own default is 50 plus 10%; this leaves it the
# first go, and keeps a busy queue from being analyzed on every maintenance run).
STALE_STATISTICS = (1000, 0.2)
# The tables whose statistics the hot statements' plans depend on.
ANALYZED_TABLES = ("backwave_job", "backwave_attempt", "backwave_dependency", "backwave_transition")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleDefinition:
    """A schedule as declared in settings, its job fields resolved from the task (sync_schedules)."""

    name: str
    task_path: str
    cron: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 1
    backoff_base: float = 1.0
    backoff_max: float = 3600.0
    backend: str = "default"
    tags: Sequence[str] = ()
    timeout: float | None = None  # the task's time limit, carried by every job minted
    limit_key: str | None = None  # the task's per-key concurrency key for these arguments, likewise
    enabled: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class DueSchedule:
    """A schedule whose next run has come (or was never computed), with the database's now()."""

    id: int
    name: str
    cron: str
    next_run: datetime | None  # None: first run after a (re)definition; nothing to mint yet
    db_now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSlot:
    """What one maintenance run decided for a due schedule (see mint_schedules_many)."""

    schedule_id: int
    cron: str  # the expression the slots were computed from: a redefined schedule is skipped
    slot: datetime | None  # the slot to mint, None to only set next_run
    next_run: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class PumpHealth:
    """A pump's health as it reports it (record_pumps_many)."""

    worker_id: str
    group: str
    hostname: str
    pid: int
    status: str  # healthy, degraded, halted
    reason: str = ""
    in_flight: int = 0
    lease_duration: float = 30.0
    queues: tuple[str, ...] = ()  # the queues it claims: what it serves, for unserved_queues


class Store(Protocol):
    """What a pump needs from the database. Implementations: PostgresStore (production)."""

    def open_lease(self, *, lease_id: uuid.UUID, worker_id: str, group: str, hostname: str, pid: int, duration: float) -> None:
        """Create the pump's lease, expiring ``duration`` seconds from now by the database clock."""

    def renew_lease(self, *, lease_id: uuid.UUID, duration: float) -> bool:
        """Push the lease's expiry to now + duration. False when the lease is gone (it lapsed and
        was expired by maintenance, or was released) or has already lapsed: a lapsed lease is
        never revived, since the fence has refused its writes from the moment it lapsed."""

    def heartbeat(self, *, lease_id: uuid.UUID, duration: float, progress: Sequence[ProgressReport] = ()) -> Heartbeat:
        """renew_lease, in the same statement writing each report's progress and metadata to its
        job (fenced: this live lease, still running, this attempt; None keeps what the row
        holds), and reading the cancels requested of the lease's running jobs. A report the
        server refuses for its data (SQLSTATE class 22) never costs the lease: the heartbeat is
        sent again without the reports, which are dropped. The renewal never waits for a job
        row: a report whose job row another transaction holds is not written, its job id comes
        back in ``Heartbeat.busy``."""

    def release_lease(self, *, lease_id: uuid.UUID) -> list[int]:
        """Put every job still running under the lease back to ready (refunding the attempt, due
        at once, a suspect still suspect) and delete the lease. Returns the released job ids."""

    def claim_jobs(self, *, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Each claimed job carries its time limit and, when a cancel was requested while an
        earlier attempt ran, who requested it (the driver then cancels it unrun).

        Lock up to ``limit`` due ready jobs of ``queues`` (priority, run_at, id order), skipping
        rows other claimers hold, and put them under the lease. Returns at once, short or empty
        when fewer are ready, and empty when the lease is gone or lapsed (no job is ever put under
        a lease that maintenance could not expire).

        Suspects (see expire_leases): at most one per claim, and none while a suspect already runs
        under the lease, so no two suspects ever share a pump. A suspect keeps its place in claim
        order and shares its queue's room; suspects waiting their turn are passed over before the
        limit, so they never make a claim come back short while other jobs are ready."""

    def write_outcomes_many(self, *, lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> Applied:
        """Apply outcomes, each fenced: a row changes only if it is still running under this live
        lease at this attempt. Inserts one Attempt row per applied outcome. Returns applied ids.
        A SUCCEEDED outcome stores its return value as JSON (None becomes JSON null); other kinds
        store no return value (SQL NULL). Texts are stored as text can hold them (a NUL or a lone
        surrogate escaped, error_class cut to 255 characters).

        One row's data never fails the batch. A record that cannot be encoded (a return value
        that is not JSON, NaN, a NUL) is replaced before anything is sent; a batch the server
        refuses for its data (SQLSTATE class 22) is bisected until the refused rows stand alone.
        Each such row is written in its place as a failed attempt with error class
        backwave.UnstorableResult and a text saying why: a SUCCEEDED outcome becomes FAILED (the
        job is not run again: its task already ran to the end, and a re-run would return the same
        value), a RETRY, FAILED or QUARANTINED keeps its kind, with its own error text (escaped
        to ASCII) below the reason; if that is refused too, the job is FAILED with the reason
        alone. One round-trip when nothing is refused; a refused row costs about 2·log2(batch)
        more. ``Applied.replaced`` names the rows written that way. Any applied outcome clears the
        job's suspect flag: the attempt ended without taking its worker down.

        SNOOZED makes the job ready after retry_delay with a 'snoozed' attempt that is added to
        forgiven_attempts (it counts neither against max_attempts nor towards the backoff);
        CANCELLED ends the job 'cancelled' with a 'cancelled' attempt. A record's progress and
        metadata, when not None, replace the job's.

        An outcome's Job Output is merged into the job's and its tag deltas applied, whatever its
        kind. An outcome that ends its job (not RETRY nor SNOOZED) settles the job's dependents
        in the same statement: one whose last ancestor succeeded is ready (``Applied.released``
        counts them); a failed, quarantined or cancelled ancestor cancels, releases or holds each
        dependent by its dependency's on_failure, a cancelled dependent cancelling its own in turn.

        An applied record with ``overrun`` leaves an overrun (job, attempt, this lease, the job's
        queue and limit key) in the same statement: its handler, which outlived the attempt,
        counts against the queue's concurrency limit and the key's per-key limit in every claim,
        as its running row did, for as long as the lease is live or until ``forget_overruns``."""

    def forget_overruns(self, *, lease_id: uuid.UUID, attempts: Sequence[tuple[int, int]]) -> int:
        """The handlers of these (job id, attempt) overruns under the lease have returned: delete
        them, so they count against no limit any more. Returns how many were deleted. An expired
        or released lease's overruns go with it, and a lapsed lease's count no more."""

    def write_outcomes_then_claim(
        self, *, lease_id: uuid.UUID, worker_id: str, outcomes: Sequence[OutcomeRecord], queues: Sequence[str], limit: int
    ) -> tuple[Applied, list[ClaimedJob]]:
        """write_outcomes_many, then claim_jobs, in ONE round-trip, the claim strictly after the
        write; if the write fails the claim does not run. How a pump at steady state spends one
        round-trip per batch. When the server refuses the write for a row's data, the outcomes
        are written as write_outcomes_many isolates them, and the claim runs after them."""

    def release_jobs_many(self, *, lease_id: uuid.UUID, job_ids: Sequence[int]) -> Released:
        """Give unfinished jobs back (ready, due now, attempt refunded, suspect unchanged), fenced
        like outcomes; returns their ids, and as ``busy`` those passed over (rows held)."""

    def reconcile_lease(self, *, lease_id: uuid.UUID, known: Sequence[tuple[int, int]]) -> Released:
        """Give back (ready, due now, attempt refunded) every job running under the lease whose
        (id, attempt) is not in ``known``: what a claim whose answer was lost may have left there,
        a later attempt of a job the caller holds at an earlier one included. Returns the (id,
        attempt) pairs given back, the attempt as it was running, and as ``busy`` the ids of
        such jobs passed over (rows held)."""

    def expire_leases(self, *, limit: int) -> int:
        """Delete up to ``limit`` leases whose expiry passed (database clock) and release their
        running jobs, each with a 'lease lapsed' attempt that says whether it counted. A job that
        was not suspect is forgiven: ready again at once, now suspect, its attempt added to
        ``forgiven_attempts`` and left out of the limit (``attempts - forgiven_attempts <
        max_attempts``). A suspect pays: its attempt counts, and it is ready again while counted
        attempts remain, failed otherwise (still suspect either way). Returns the number of jobs
        released."""

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[int]:
        """Insert jobs in one statement; returns their ids in input order. Jobs with ``after``
        are inserted waiting (or ready when every ancestor has already succeeded) with their
        dependency rows, in the same statement; DependencyRefused, with nothing written, when an
        ancestor does not exist or already ended badly under a policy other than run."""

    # -- transition observers (backwave/observers.py) ----------------------------------------------
    # ``observed`` (a store attribute, NOTHING_OBSERVED unless set: the JSON list of {kind,
    # task_path, queue, observer} of ObserverRegistry.observed) says which transitions
    # write_outcomes_many, write_outcomes_then_claim and expire_leases note in
    # backwave_transition, in the statement that applies them (the outcomes and lapses, and the
    # cancels of the dependents they settle), each row naming the observers it is for.

    def claim_transitions(
        self, *, token: uuid.UUID, limit: int, lease: float, observers: Sequence[str] = (), deliverer: str | None = None
    ) -> list[TransitionRecord]:
        """Claim up to ``limit`` due pending transitions (oldest due first) that wait for one of
        ``observers`` (the claimer's, by name) or name none, skipping rows other claimers hold:
        each is stamped with ``token`` and due again ``lease`` seconds from now, so a claimer
        that dies leaves it to the next. A row waiting only for observers the claimer lacks is
        left to a claimer that has them. ``deliverer`` (this process's observer loop) is recorded
        with ``observers``, for the Transitions page."""

    def settle_transitions(self, *, token: uuid.UUID, results: Sequence[DeliveryResult]) -> set[int]:
        """Record a delivery pass, fenced by its claim's ``token``: delete each transition every
        observer of which has now run; keep one whose other observers this claimer lacks (due at
        once for them), and a failed one (its observers that ran are remembered), due after
        ``retry_delay`` or dead. Returns the ids settled (a claim that lapsed settles none)."""

    # -- maintenance: schedules, retention, pump health --------------------------------------------

    def sync_schedules(self, *, schedules: Sequence[ScheduleDefinition]) -> list[str]:
        """Write the declared schedules (insert or update by name) and disable enabled rows that
        are no longer declared; returns the names disabled. A schedule whose cron expression
        changed, or that comes back from disabled, gets next_run NULL: it starts at its next slot."""

    def due_schedules(self, *, limit: int) -> list[DueSchedule]:
        """Up to ``limit`` enabled schedules whose next_run is NULL or has come, by the database
        clock, each carrying that clock's now() so the caller evaluates cron against it."""

    def mint_schedules_many(self, *, slots: Sequence[ScheduleSlot]) -> list[int]:
        """For each slot whose schedule is still due, enabled, on the same cron expression and not
        locked by another minter: insert the slot's job (unless that (schedule, slot) exists or is
        not later than the last minted slot) and move next_run on. Returns the minted job ids.
        Safe to run on any number of nodes at once: each slot becomes at most one job."""

    def purge_jobs(self, *, older_than: Sequence[tuple[str, float]], limit: int) -> int:
        """Delete up to ``limit`` finished jobs (with their attempts) whose state is listed and whose
        finished_at is more than that many seconds before now(); returns how many."""

    def roll_up_task_stats(self, *, limit: int, settle: float = ROLLUP_SETTLE) -> int:
        """Fold up to ``limit`` finished attempts past the rollup's watermark into the per-task
        statistics (a bucket per task, minute and hour); returns how many. Only attempts no
        transaction can still commit below are taken: those up to the horizon an earlier run
        noted, once every transaction running then has ended or ``settle`` seconds have passed.
        So a new attempt is rolled up by the second run after it committed. A node that finds
        another rolling up does nothing. Never rolls an attempt up twice."""

    def record_pumps_many(self, *, pumps: Sequence[PumpHealth]) -> None:
        """Insert or update each pump's health row, stamping last_heartbeat_at with now()."""

    def forget_pumps_many(self, *, worker_ids: Sequence[str]) -> int:
        """Delete these pumps' health rows (a clean stop); returns how many."""

    def unserved_queues(self) -> list[tuple[str, float]]:
        """(queue, seconds its oldest due job has waited) for each queue, by name, with a due
        ready job that no live pump serves: none not halted, under a live lease, lists it in its
        health row. Paused queues are left out."""

    def purge_pumps(self, *, older_than: float) -> int:
        """Delete the health rows of pumps silent for more than ``older_than`` seconds."""

    def purge_task_stats(self, *, older_than: Sequence[tuple[int, float]], limit: int) -> int:
        """Delete up to ``limit`` per-task statistics buckets of each listed resolution (seconds a
        bucket spans) that began more than that many seconds before now(); returns how many."""

    def refresh_statistics(self) -> list[str]:
        """ANALYZE those of BackWave's busy tables whose planner statistics fell behind: changed
        since their last analysis by more than ``STALE_STATISTICS`` allows. Returns their names
        (none when all are fresh, or another session is analyzing them). A store without a planner
        has nothing to refresh."""

    def close(self) -> None:
        """Close the connection."""

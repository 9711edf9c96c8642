"""The executor: the one interpreter of the Node Driver's store commands.

Theory of operation
-------------------
The driver answers each event with commands; the executor runs the store's part of them and
turns each result into the event that reports it. The production pump, the deterministic test
pump and the simulator's pump all run their commands here, so they make the same calls with the
same arguments and report the same events: "the test pump decides as production does" holds by
construction. What differs per caller is its loop (a thread, the test's thread, simulated time)
and a few hooks; ``ExecuteJob`` stays the caller's, which runs handlers its own way.

It starts no thread, imports no Django and reads no clock or randomness of its own: the caller
passes ``clock`` (stamps every event's ``now``), ``jitter`` (a fault's backoff draw) and
``new_lease_id`` (``uuid.uuid4`` in production, a seeded source in tests: ``lease_ids_from``).

The command list rules (``backwave/core/commands.py``): a ``WriteOutcomes`` followed by a
``ClaimJobs`` goes out as one pipelined ``write_outcomes_then_claim`` (``take``), and when the
write fails, every ``ClaimJobs`` that follows it in the pass fails with it unrun (``failed``):
they were sized for the slots the write would free.

Overlap: the production pump passes ``aside``, which runs each write and claim on its store
thread while the finished jobs that come in meanwhile are fed to the driver at once (``process``
says what that changes, and what it does not); the test pump and the simulator make every call on
their own thread, so their runs stay deterministic.

Reports: each attempt's report rides on its outcome; ``record`` joins the two into the row the
store writes, and once a write lands ``on_applied(outcome, written)`` is called for each outcome
the fence let through (``written``: the record the store wrote instead when it could not store
the attempt's own), never for one it refused.

Faults: with ``on_fault`` given, a ``TransientStoreError`` is passed to it and reported to the
driver as ``StoreFailed``; without it (the test pump, the simulator), every store error
propagates to the caller. ``on_answered`` is called after every store call that completed.
What a pump says about its own calls goes to ``logger`` (none: silent); maintenance reports to
``backwave.maintenance`` whoever runs it.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import tzinfo
from typing import TYPE_CHECKING

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.jobs import ClaimedJob, Outcome, OutcomeKind
from backwave.core.options import WorkerGroupOptions
from backwave.store.contract import OutcomeRecord, ProgressReport, Store, TransientStoreError

from .schedules import mint_due

if TYPE_CHECKING:
    from random import Random

Batch = tuple[cmd.Command, ...]

# Schedules and retention report here whoever runs them; the rest goes to the caller's logger.
maintenance_logger = logging.getLogger("backwave.maintenance")


def outcome_record(outcome: Outcome) -> OutcomeRecord:
    """The outcome as the store writes it: the driver's verdict plus the report that rode on it
    (if its JobFinished carried one)."""
    report = outcome.report
    if outcome.reason:
        return replace(_driver_ended(outcome, report), overrun=outcome.overrun)
    if report is None:
        return OutcomeRecord(job_id=outcome.job_id, attempt=outcome.attempt, kind=outcome.kind, retry_delay=outcome.retry_delay)
    return OutcomeRecord(
        job_id=outcome.job_id,
        attempt=outcome.attempt,
        kind=outcome.kind,
        retry_delay=outcome.retry_delay,
        return_value=report.return_value if outcome.kind is OutcomeKind.SUCCEEDED else None,
        error_class=report.error_class,
        traceback=report.traceback,
        duration=report.duration,
        output=report.output,
        tags_added=report.tags_added,
        tags_removed=report.tags_removed,
        progress=getattr(report, "progress", None),
        metadata=getattr(report, "metadata", None),
    )


TIME_LIMIT_EXCEEDED = "backwave.TimeLimitExceeded"
CANCELLED = "backwave.Cancelled"


def _driver_ended(outcome: Outcome, report) -> OutcomeRecord:
    """The record of an attempt the driver ended itself (a timeout, a cancel), saying why; the
    handler's own error, when it reported one, below that."""
    if outcome.reason == "timeout":
        error_class, text = (
            TIME_LIMIT_EXCEEDED,
            f"{TIME_LIMIT_EXCEEDED}: the attempt ran past its time limit and was ended without its handler.",
        )
    else:
        error_class, text = CANCELLED, f"{CANCELLED}: {outcome.reason}."
    if report is not None and report.traceback:
        text += f"\n\nThe handler then ended with:\n{report.traceback}"
    return OutcomeRecord(
        job_id=outcome.job_id,
        attempt=outcome.attempt,
        kind=outcome.kind,
        retry_delay=outcome.retry_delay,
        error_class=error_class,
        traceback=text + "\n",
        duration=getattr(report, "duration", 0.0),
        progress=getattr(report, "progress", None),
        metadata=getattr(report, "metadata", None),
        output=getattr(report, "output", None),
        tags_added=getattr(report, "tags_added", ()),
        tags_removed=getattr(report, "tags_removed", ()),
    )


def _with_earlier(earlier: Sequence[ProgressReport], later: Sequence[ProgressReport]) -> list[ProgressReport]:
    """``later``'s reports, each over an earlier one of the same attempt (a value not set since,
    None, keeps the earlier one's), and the earlier ones nothing came since for."""
    if not earlier:
        return list(later)
    merged = {(report.job_id, report.attempt): report for report in earlier}
    for report in later:
        before = merged.get((report.job_id, report.attempt))
        if before is not None:
            report = replace(
                report,
                progress=before.progress if report.progress is None else report.progress,
                metadata=before.metadata if report.metadata is None else report.metadata,
            )
        merged[(report.job_id, report.attempt)] = report
    return list(merged.values())


def _released(applied) -> int:
    """The dependents a write made ready (a store double may answer a plain set)."""
    return getattr(applied, "released", 0) if applied else 0


def _busy(applied) -> frozenset[int]:
    """The jobs a write or release passed over for rows another transaction held (none from a
    plain set)."""
    return getattr(applied, "busy", frozenset())


def lease_ids_from(rng: Random) -> Callable[[], uuid.UUID]:
    """Lease ids drawn from a seeded source: the same run every time (tests, the simulator)."""
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


def _nothing(*_args) -> None:
    return None


def runs_aside(batch: Batch) -> bool:
    """Whether ``process`` hands the batch to its ``aside``: a write, a claim, or the two
    pipelined, the calls a busy pump makes per batch of jobs. The rest (leases, maintenance)
    are seconds apart and run on the caller's thread."""
    return isinstance(batch[0], (cmd.WriteOutcomes, cmd.ClaimJobs))


# aside(call, early): runs ``call`` elsewhere and returns its answer or raises its error, calling
# ``early(event)`` on the caller's thread for each finished job that comes in meanwhile.
Aside = Callable[[Callable[[], object], Callable[[ev.Event], None]], object]


class Executor:
    """Runs one pump's store commands against ``store`` (which a pump may set once it opens).
    One per pump, used by its thread only."""

    def __init__(
        self,
        store: Store | None,
        *,
        options: WorkerGroupOptions,
        worker_id: str,
        hostname: str,
        pid: int,
        clock: Callable[[], float],
        jitter: Callable[[], float],
        time_zone: Callable[[], tzinfo],
        new_lease_id: Callable[[], uuid.UUID],
        on_applied: Callable[[Outcome, OutcomeRecord | None], None] = _nothing,
        on_lease_held: Callable[[], None] = _nothing,
        on_fault: Callable[[TransientStoreError], None] | None = None,
        on_answered: Callable[[], None] = _nothing,
        progress: Callable[[], Sequence[ProgressReport]] = tuple,
        stop_attempt: Callable[[cmd.StopAttempt], None] = _nothing,
        logger: logging.Logger | None = None,
    ):
        self.store = store
        self.options = options
        self.worker_id = worker_id
        self._hostname = hostname
        self._pid = pid
        self._clock = clock
        self._jitter = jitter
        self._time_zone = time_zone  # cron is evaluated in it; asked per run, as settings may change
        self._new_lease_id = new_lease_id
        self._on_applied = on_applied
        self._on_lease_held = on_lease_held  # the production pump's health row rides the lease
        self._on_fault = on_fault
        self._on_answered = on_answered
        self._progress = progress  # what the running attempts reported since the last heartbeat
        # Reports the last heartbeat could not write (another transaction held their job rows):
        # sent again with the next one, under what the attempt reported since.
        self._busy_reports: list[ProgressReport] = []
        self._stop_attempt = stop_attempt  # flags a handler's context (StopAttempt)
        self._logger = logger

    # ---- the loop every synchronous caller shares -----------------------------------------------

    def process(
        self,
        handle: Callable[[ev.Event], Iterable[cmd.Command]],
        event: ev.Event,
        *,
        execute_job: Callable[[ClaimedJob], None],
        stop: Callable[[], bool] = lambda: False,
        arrived: Callable[[], Iterable[ev.Event]] = tuple,
        aside: Aside | None = None,
        due: Callable[[], ev.Event | None] = _nothing,
    ) -> None:
        """Feed ``event`` to ``handle`` (the driver) and run what it answers, each result fed
        back as the next event, until nothing is left (or ``stop()`` says to leave at once).

        ``arrived()`` gives the events that came in while a store call ran (the production
        pump's finished jobs): they are fed before the call's results, so the decisions those
        results prompt (the next write, the claim riding it) count the slots they freed and take
        their outcomes along. Fed after, each finished job found the write just decided and went
        out in a round-trip of its own: with no linger, 1.0 round-trips a job.

        ``aside(call, early)``, when given, runs a write's or a claim's store call elsewhere and
        returns its answer (or raises its error), calling ``early(event)`` meanwhile, on the
        caller's thread, for each finished job that comes in while the call runs. Such an event
        is fed to the driver then, not after the call: the jobs it starts (a job claimed ahead
        taking the thread it freed) and the attempts it stops are carried out at once, while its
        store commands wait, in order, behind the call, as they would have without ``aside``. The
        driver sees the same events in the same order either way; what changes is that handler
        threads go on running jobs while the pump waits for PostgreSQL.

        ``due()`` is asked after each store call for a ``Tick`` if some deadline of the driver
        has passed meanwhile (None if not), which is then fed before the call's results: a busy
        pump whose calls each bring in the finished jobs that make the next one may never leave
        this loop, and its heartbeat, its linger and its attempts' time limits must not wait
        for it to (a pump fed without a pause lost its lease for want of a heartbeat).
        """
        pending = deque(handle(event))
        while pending and not stop():
            command = pending.popleft()
            if isinstance(command, cmd.ExecuteJob):
                execute_job(command.job)
                continue
            if isinstance(command, cmd.StopAttempt):
                self._stop_attempt(command)
                continue
            batch = self.take(command, pending)
            fed: list[float] = []  # when each event fed before the call's results was posted
            behind: list[cmd.Command] = []  # the early events' store commands: after this call

            def early(finished: ev.Event) -> None:
                fed.append(finished.now)
                for answer in handle(finished):
                    if isinstance(answer, cmd.ExecuteJob):
                        if not stop():  # leaving at once starts nothing more
                            execute_job(answer.job)
                    elif isinstance(answer, cmd.StopAttempt):
                        self._stop_attempt(answer)
                    else:
                        behind.append(answer)

            results = self.call(batch, pending, aside if runs_aside(batch) else None, early)
            pending.extend(behind)
            for finished in arrived():
                fed.append(finished.now)
                pending.extend(handle(finished))
            if (tick := due()) is not None:
                fed.append(tick.now)
                pending.extend(handle(tick))
            latest = max(fed, default=None)
            for result in results:
                if latest is not None and result.now < latest:
                    result = replace(result, now=latest)  # one posted after the answer came: time runs on
                pending.extend(handle(result))

    # ---- the steps, for a caller that runs them apart (the simulator) ---------------------------

    @staticmethod
    def take(command: cmd.Command, pending: deque[cmd.Command]) -> Batch:
        """The batch ``command`` starts: itself, or a write with the claim that follows it."""
        if isinstance(command, cmd.WriteOutcomes) and pending and isinstance(pending[0], cmd.ClaimJobs):
            return (command, pending.popleft())
        return (command,)

    def call(
        self, batch: Batch, pending: deque[cmd.Command], aside: Aside | None = None, early: Callable[[ev.Event], None] = _nothing
    ) -> list[ev.Event]:
        """Run the batch; a transient fault becomes ``StoreFailed`` when the caller handles faults.
        Through ``aside`` (a write, a claim or both) only the store call runs elsewhere: what its
        answer means (the fence's verdicts, ``on_applied``) is worked out here, on this thread."""
        try:
            if aside is None:
                events = self.run(batch)
            else:
                events = self._answered(batch, aside(self._store_call(batch), early))
        except TransientStoreError as error:
            if self._on_fault is None:
                raise
            self._on_fault(error)
            return self.failed(batch, pending)
        self._on_answered()
        return events

    def failed(self, batch: Batch, pending: deque[cmd.Command]) -> list[ev.Event]:
        """The events of a batch whose answer never came: each command failed. A failed write
        takes down every claim that follows it (popped from ``pending``), unrun."""
        now = self._clock()
        results: list[ev.Event] = [ev.StoreFailed(now=now, command=command, jitter=self._jitter()) for command in batch]
        if isinstance(batch[0], cmd.WriteOutcomes):
            while pending and isinstance(pending[0], cmd.ClaimJobs):
                results.append(replace(results[-1], command=pending.popleft()))
        return results

    def run(self, batch: Batch) -> list[ev.Event]:
        """Run the batch against the store: one event per command. Store errors propagate."""
        if runs_aside(batch):
            return self._answered(batch, self._store_call(batch)())
        return [self._run_one(batch[0])]

    def _store_call(self, batch: Batch) -> Callable[[], object]:
        """The store call of a write, a claim or both, ready to run on any thread: the records
        are made here, and the call touches nothing but the store."""
        store, worker_id = self.store, self.worker_id
        first = batch[0]
        if len(batch) == 2:
            claim = batch[1]
            records = [outcome_record(outcome) for outcome in first.outcomes]
            return lambda: store.write_outcomes_then_claim(
                lease_id=first.lease_id, worker_id=worker_id, outcomes=records, queues=claim.queues, limit=claim.limit
            )
        if isinstance(first, cmd.ClaimJobs):
            return lambda: store.claim_jobs(lease_id=first.lease_id, worker_id=worker_id, queues=first.queues, limit=first.limit)
        records = [outcome_record(outcome) for outcome in first.outcomes]
        return lambda: store.write_outcomes_many(lease_id=first.lease_id, outcomes=records)

    def _answered(self, batch: Batch, answer) -> list[ev.Event]:
        """The events reporting a write's, a claim's or both's answer from the store."""
        first = batch[0]
        if len(batch) == 2:
            applied, jobs = answer
            self._settled(first.outcomes, applied)
            now = self._clock()
            return [
                ev.OutcomesWritten(now=now, applied=frozenset(applied), released=_released(applied), busy=_busy(applied)),
                ev.ClaimReturned(now=now, jobs=tuple(jobs)),
            ]
        if isinstance(first, cmd.ClaimJobs):
            return [ev.ClaimReturned(now=self._clock(), jobs=tuple(answer))]
        self._settled(first.outcomes, answer)
        return [ev.OutcomesWritten(now=self._clock(), applied=frozenset(answer), released=_released(answer), busy=_busy(answer))]

    def _run_one(self, command: cmd.Command) -> ev.Event:
        store, options = self.store, self.options
        match command:
            case cmd.OpenLease():
                lease_id = self._new_lease_id()
                store.open_lease(
                    lease_id=lease_id,
                    worker_id=self.worker_id,
                    group=options.name,
                    hostname=self._hostname,
                    pid=self._pid,
                    duration=options.lease_duration,
                )
                self._on_lease_held()
                return ev.LeaseOpened(now=self._clock(), lease_id=lease_id)
            case cmd.RenewLease():
                reports = _with_earlier(self._busy_reports, self._progress())
                beat = store.heartbeat(lease_id=command.lease_id, duration=options.lease_duration, progress=reports)
                self._busy_reports = [report for report in reports if report.job_id in beat.busy] if beat.held else []
                if beat.held:
                    self._on_lease_held()
                return ev.LeaseRenewed(now=self._clock(), held=beat.held, cancels=tuple(sorted(beat.cancels.items())))
            case cmd.ReconcileLease():
                released = store.reconcile_lease(lease_id=command.lease_id, known=command.known)
                if released:
                    self._log(
                        logging.WARNING,
                        "Pump %s gave back %d job(s) a lost claim answer had left under its lease",
                        self.worker_id,
                        len(released),
                    )
                return ev.LeaseReconciled(now=self._clock(), released=frozenset(released), busy=_busy(released))
            case cmd.ForgetOverruns():
                forgotten = store.forget_overruns(lease_id=command.lease_id, attempts=command.attempts)
                return ev.OverrunsForgotten(now=self._clock(), forgotten=forgotten)
            case cmd.ReleaseJobs():
                released = store.release_jobs_many(lease_id=command.lease_id, job_ids=command.job_ids)
                return ev.JobsReleased(now=self._clock(), released=frozenset(released), busy=_busy(released))
            case cmd.ReleaseLease():
                released = store.release_lease(lease_id=command.lease_id)
                if released:
                    self._log(logging.INFO, "Pump %s gave back %d unfinished job(s)", self.worker_id, len(released))
                return ev.LeaseReleased(now=self._clock())
            case cmd.ExpireLeases():
                expired = store.expire_leases(limit=command.limit)
                if expired:
                    self._log(logging.INFO, "Released %d job(s) from lapsed leases", expired)
                return ev.LeasesExpired(now=self._clock(), released=expired)
            case cmd.MintSchedules():
                return ev.SchedulesMinted(now=self._clock(), minted=len(mint_due(store, self._time_zone())))
            case cmd.PurgeJobs():
                purged = store.purge_jobs(older_than=command.retention.job_states, limit=command.limit)
                if purged:
                    maintenance_logger.info("Retention: purged %d finished job(s)", purged)
                return ev.JobsPurged(now=self._clock(), purged=purged)
            case cmd.RollUpStats():
                rolled = store.roll_up_task_stats(limit=command.limit)
                if rolled:
                    maintenance_logger.debug("Statistics: rolled up %d finished attempt(s)", rolled)
                return ev.StatsRolledUp(now=self._clock(), rolled=rolled)
            case cmd.AnalyzeTables():
                tables = store.refresh_statistics()
                if tables:
                    maintenance_logger.info("Statistics: analyzed %s (they fell behind their changes)", ", ".join(tables))
                return ev.TablesAnalyzed(now=self._clock(), tables=tuple(tables))
            case cmd.PurgePumps():
                purged = store.purge_pumps(older_than=command.older_than)
                if purged:
                    maintenance_logger.info("Forgot %d pump(s) silent for more than %.0f s", purged, command.older_than)
                return ev.PumpsPurged(now=self._clock(), purged=purged)
            case cmd.PurgeTaskStats():
                purged = store.purge_task_stats(older_than=command.older_than, limit=command.limit)
                if purged:
                    maintenance_logger.info("Statistics: purged %d bucket(s) past retention", purged)
                return ev.TaskStatsPurged(now=self._clock(), purged=purged)
        raise TypeError(f"the executor cannot run {command!r}")

    def _settled(self, outcomes: tuple[Outcome, ...], applied) -> None:
        """The write landed: hand each outcome the fence let through to ``on_applied``, with the
        record written in its place if any, and say so when the fence refused some."""
        replaced = getattr(applied, "replaced", {})  # a store double may answer a plain set
        for outcome in outcomes:
            if outcome.job_id in applied:
                # An attempt the driver ended (a cancel) was written as the driver's record, not
                # as its handler's report: task_finished says what was stored.
                written = replaced.get(outcome.job_id) or (outcome_record(outcome) if outcome.reason else None)
                self._on_applied(outcome, written)
        busy = _busy(applied)
        if len(applied) + len(busy) < len(outcomes):
            self._log(
                logging.WARNING,
                "Pump %s: the lease fence refused %d of %d outcome(s); those jobs were expired or re-claimed and run elsewhere",
                self.worker_id,
                len(outcomes) - len(applied) - len(busy),
                len(outcomes),
            )
        if busy:
            self._log(
                logging.DEBUG,
                "Pump %s: another transaction holds the row of job(s) %s; their outcome is written again shortly",
                self.worker_id,
                ", ".join(f"#{job_id}" for job_id in sorted(busy)),
            )

    def _log(self, level: int, message: str, *args) -> None:
        if self._logger is not None:
            self._logger.log(level, message, *args)

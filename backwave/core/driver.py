"""The Node Driver: the sans-I/O state machine one pump obeys.

Theory of operation
-------------------
The shell feeds events in (``handle``) and executes the commands that come back, in order,
turning each result into the next event. The driver decides everything that matters for
scheduling: how many jobs to claim, when to write outcomes, when to heartbeat, when to run
maintenance, what a failed attempt turns into. It reads no clock (time arrives in ``event.now``,
monotonic seconds), opens no connection and starts no thread, so production and the
deterministic test pump make identical decisions.

The lifecycle states, the events each accepts and what each does: the transition table in
core/transitions.py, whose data handle() consults before any handler runs. The driver holds the
pump's state and makes the decisions that need all of it; its parts are dataclasses beside it,
sharing its ``Ledger`` of commands in flight: core/slots.py (backpressure), outcomes.py (counted
attempts, reports, the buffer), claims.py, lease.py (its clocks, self-fencing), drain.py and
maintenance.py.
"""

from __future__ import annotations

import uuid

from . import claims
from . import commands as cmd
from . import events as ev
from .backoff import FaultStreak
from .drain import Drain
from .jobs import ClaimedJob
from .lease import LeaseClock
from .ledger import Ledger
from .maintenance import PURGE_BATCH, ROLLUP_BATCH, Maintenance
from .options import SELF_FENCE_MARGIN, WorkerGroupOptions
from .outcomes import OutcomeBuffer, cancel_reason, decide
from .overruns import Overruns
from .slots import Slots
from .stats import DriverStats
from .transitions import ACCEPTS, AWAITED, STALE_TOLERANT, STORE_RESULTS, UNTRACKED, InvalidEvent, State, answered_by

__all__ = ["PURGE_BATCH", "ROLLUP_BATCH", "SELF_FENCE_MARGIN", "DriverStats", "InvalidEvent", "NodeDriver", "State"]


class NodeDriver:
    """The decision-maker of one pump. Its transition table: core/transitions.py."""

    def __init__(self, options: WorkerGroupOptions):
        self.options = options
        self.queues = tuple(options.policy.queues)
        self.state = State.NEW
        self.stats = DriverStats()
        self.lease_id: uuid.UUID | None = None
        self._ledger = Ledger()  # the store commands in flight, and stale results still due
        self._claims = claims.Claims(options, self._ledger)
        self._faults = FaultStreak()
        self._maintenance = Maintenance(options, self._ledger)
        self._overruns = Overruns(self._ledger)
        self._outcomes = OutcomeBuffer(options, self._ledger, overruns=self._overruns)
        self._slots = Slots(options, self._outcomes)
        self._lease = LeaseClock(options, self._ledger)
        self._drain = Drain(self._ledger, self._slots)
        # Jobs a release passed over (another transaction held their rows; ******** in the
        # transition table), by id: when to give them back again.
        self._releases_again: dict[int, float] = {}

    # ---- what the shell may ask -------------------------------------------------------------

    @property
    def executing(self) -> int:
        return len(self._slots.executing)

    @property
    def unreported(self) -> int:
        """Jobs claimed and not yet reported: executing, claimed ahead, buffered, or in a write in flight."""
        return self._slots.unreported

    @property
    def claimed_ahead(self) -> int:
        """Jobs claimed and waiting for a thread (core/slots.py): running by the database, not started."""
        return len(self._slots.queued)

    @property
    def free_slots(self) -> int:
        """Slots no job holds: the pool's threads, and the room ahead while the pump claims ahead
        (core/slots.py); claimed jobs, claims in flight and abandoned handlers each take one."""
        return max(0, self._slots.capacity - self.unreported - self._claim_limit - len(self._slots.abandoned))

    @property
    def idle(self) -> bool:
        """Running, nothing held, and the last claim found fewer jobs than it asked for."""
        return self.state is State.RUNNING and self._claims.last_short and not self.unreported and not self._claim_limit

    def next_wakeup(self) -> float | None:
        """When the shell should send the next Tick; None once stopped."""
        if self.state in (State.NEW, State.STOPPED):
            return None
        if self.state is State.OPENING:
            return None if self._ledger.busy(cmd.OpenLease) else self._lease.next_open
        deadlines = [self._lease.next_heartbeat, self._lease.trusted_until]
        if self.state is State.RUNNING:
            deadlines += [self._claims.next_poll, self._maintenance.next_due()]
            # A claim in flight has the lingered write wait for its answer (see _flush).
            if (linger_due := self._outcomes.linger_due) is not None and not self._claim_limit:
                deadlines.append(linger_due)
        elif self._drain.deadline is not None:
            deadlines.append(self._drain.deadline)
            if (held_back_due := self._outcomes.held_back_due) is not None:
                deadlines.append(held_back_due)  # a busy outcome's next write
        if (attempt_deadline := self._slots.next_deadline()) is not None:
            deadlines.append(attempt_deadline)
        if (forget_due := self._overruns.next_due()) is not None:
            deadlines.append(forget_due)
        if self._releases_again:
            deadlines.append(min(self._releases_again.values()))
        return min(deadlines)

    @property
    def _claim_limit(self) -> int:
        return self._claims.limit_in_flight

    # Read by the simulator's checks (backwave/testing/simulation).
    _executing = property(lambda self: self._slots.executing)
    _abandoned = property(lambda self: self._slots.abandoned)

    # ---- the one entry point ----------------------------------------------------------------

    def handle(self, event: ev.Event) -> list[cmd.Command]:
        """Take one event, return the commands to run in order."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise InvalidEvent(event, self.state, "unknown event type")
        answered = answered_by(event)
        if answered in STALE_TOLERANT and self._ledger.swallow_stale(answered):
            # Sent under a lease given up: not ours any more, and the store's fence made it a no-op.
            commands = []
        elif type(event) not in ACCEPTS[self.state]:
            raise InvalidEvent.refused(event, self.state)
        elif (awaited := AWAITED.get(type(event))) and not self._ledger.busy(awaited):
            raise InvalidEvent(event, self.state, f"no {awaited.__name__} is in flight")
        else:
            commands = handler(self, event)
        if type(event) in STORE_RESULTS:
            self._faults.end()  # the store answered: the next fault backs off from the start
        return commands

    # ---- handlers: each checks its event's preconditions before it changes anything ---------

    def _on_started(self, event: ev.Started) -> list[cmd.Command]:
        self.state = State.OPENING
        return self._lease.open(event.now)

    def _on_lease_opened(self, event: ev.LeaseOpened) -> list[cmd.Command]:
        self.lease_id = event.lease_id
        # Trusted and heartbeated from now on, even while it is being given straight back below.
        self._trust_lease_from(self._lease.opened(event.now))
        if self.state is State.STOPPED:
            # Drain came while the lease was being opened: give it straight back.
            self.state = State.DRAINING
            return self._drain.release(event.now, event.lease_id)
        self.state = State.RUNNING
        # Maintenance at once: a worker that crashed before us may have left lapsed leases.
        self._maintenance.next_run = event.now
        self._claims.next_poll = event.now
        return self._on_due(event.now)

    def _on_tick(self, event: ev.Tick) -> list[cmd.Command]:
        if self.state is State.STOPPED:
            return []
        if self.state is State.OPENING:
            return self._lease.open(event.now) if self._lease.reopen_due(event.now) else []
        return self._on_due(event.now)

    def _on_hint(self, event: ev.HintReceived) -> list[cmd.Command]:
        if self.state is not State.RUNNING or not self._claims.hinted_at(event.now, self.free_slots):
            return []
        return self._on_due(event.now)

    def _on_cancel_requested(self, event: ev.CancelRequested) -> list[cmd.Command]:
        if self.state not in (State.RUNNING, State.DRAINING):
            return []
        if self._slots.cancel_queued(event.job_id, event.by, event.now):
            # Claimed ahead, not started: it never runs, and its outcome goes as any other's.
            return self._flush(event.now, then_claim=True) if self._write_due(event.now) else []
        job = self._slots.cancel(event.job_id, event.by, event.now + self.options.cancel_grace)
        if job is None:
            return []  # not running here (another pump's, or already reported), or already noted
        return [cmd.StopAttempt(job_id=job.id, attempt=job.attempt, reason=cancel_reason(event.by))]

    def _on_claim_returned(self, event: ev.ClaimReturned) -> list[cmd.Command]:
        try:
            self.stats.lost += self._slots.take(event.jobs, self._ledger.oldest(cmd.ClaimJobs).limit)
        except ValueError as refused:
            raise InvalidEvent(event, self.state, str(refused)) from None
        self._claims.landed(len(event.jobs))
        self.stats.claims += 1
        self.stats.claimed += len(event.jobs)
        if self.state is State.DRAINING:
            return self._drain.give_back(event.jobs, self.lease_id) + self._drain_step(event.now)
        return self._run(event.jobs, event.now)

    def _on_job_finished(self, event: ev.JobFinished) -> list[cmd.Command]:
        try:
            job = self._slots.finishing(event.job_id, event.attempt)
            if job is None:
                # An abandoned attempt: its thread is free for the next job claimed ahead, and
                # a handler that outlived its attempt under this lease counts against no limit.
                self._overruns.handler_returned(event.job_id, event.attempt)
                return self._slots.start_queued(event.now) + self._forget_overruns(event.now)
            # Decided before any change: a refused event leaves no trace.
            outcome = decide(job, event, cancelled_by=self._slots.cancels.get(job.id))
        except ValueError as error:  # an unknown attempt or result, a jitter outside [0, 1)
            raise InvalidEvent(event, self.state, str(error)) from None
        if event.result == "committed":
            return self._committed(job, event.now)
        self._slots.report(outcome, event.now)
        if self.state is State.DRAINING:
            return self._drain_step(event.now)
        # The thread takes the next job claimed ahead first: the write below then sees it
        # executing (and expected to end when its task does), not an idle pool.
        commands = self._slots.start_queued(event.now)
        if self._write_due(event.now):
            return commands + self._flush(event.now, then_claim=True)
        return commands

    def _committed(self, job: ClaimedJob, now: float) -> list[cmd.Command]:
        """An atomic task's attempt committed its outcome with its effects: the store applied it
        (fenced), so nothing is buffered and the slot reopens. The claim for the slots it frees
        is batched as a buffered outcome's would be: with the write that flushes the buffer once
        nothing executes, or on its own when nothing is buffered and nothing executes, or when
        the free slots fill an outcome batch."""
        self._slots.committed(job.id, now)
        self.stats.applied += 1
        if self.state is State.DRAINING:
            return self._drain_step(now)
        commands = self._slots.start_queued(now)
        if not self._slots.executing and self._outcomes.waiting:
            return commands + self._flush(now, then_claim=True)
        if not self._slots.executing or self.free_slots >= self.options.outcome_batch:
            return commands + self._claim(now)
        return commands

    def _on_outcomes_written(self, event: ev.OutcomesWritten) -> list[cmd.Command]:
        written = {o.job_id for o in self._outcomes.writing}
        if not event.applied <= written:
            raise InvalidEvent(event, self.state, f"applied ids {sorted(event.applied - written)} were not in the write")
        if not event.busy <= written - event.applied:
            raise InvalidEvent(
                event, self.state, f"busy ids {sorted(event.busy - (written - event.applied))} were not in the write, or applied"
            )
        if event.released < 0 or (event.released and not event.applied):
            raise InvalidEvent(
                event, self.state, f"released must be 0 or more, and only with applied outcomes; got {event.released}"
            )
        self.stats.writes += 1
        self.stats.released += event.released
        self.stats.applied += len(event.applied)
        self.stats.lost += len(written) - len(event.applied) - len(event.busy)
        self.stats.busy += len(event.busy)
        self._outcomes.written(event.now, event.busy)
        if self.state is State.DRAINING:
            return self._drain_step(event.now)
        if self.state is not State.RUNNING:
            return []
        if self._write_due(event.now):
            return self._flush(event.now, then_claim=True)
        if not self._claim_limit and self.free_slots:
            # Re-poll after an applied batch: work may have become due meanwhile, and the
            # dependents the write released became ready in it. (A claim in flight was queued
            # behind the write on the pump's one connection: it sees them already.)
            return self._claim(event.now)
        return []

    def _on_lease_renewed(self, event: ev.LeaseRenewed) -> list[cmd.Command]:
        sent_at = self._lease.renewed()
        self.stats.heartbeats += 1
        if event.held:
            self._trust_lease_from(sent_at)
            # The safety net under the NOTIFY: each cancel as if it had been heard.
            return [
                command
                for job_id, by in event.cancels
                for command in self._on_cancel_requested(ev.CancelRequested(now=event.now, job_id=job_id, by=by))
            ]
        return self._lose_lease(event.now)

    def _on_nothing_to_do(self, event: ev.Event) -> list[cmd.Command]:
        return []

    def _on_schedules_minted(self, event: ev.SchedulesMinted) -> list[cmd.Command]:
        if event.minted < 0:
            raise InvalidEvent(event, self.state, f"minted must not be negative, got {event.minted}")
        self.stats.minted += event.minted
        return self._claim_made_ready(event.minted, event.now)

    def _on_leases_expired(self, event: ev.LeasesExpired) -> list[cmd.Command]:
        return self._claim_made_ready(event.released, event.now)

    def _claim_made_ready(self, made_ready: int, now: float) -> list[cmd.Command]:
        """Jobs this pump's own statement made ready: claimed now, room permitting. The wake-up
        hint that statement sent is not heard here (a pump drops its own store session's), and
        a claim in flight runs after it on the same connection and sees them anyway."""
        return self._claim(now) if made_ready > 0 else []  # _claim sends nothing without room or with one in flight

    def _on_jobs_purged(self, event: ev.JobsPurged) -> list[cmd.Command]:
        if not 0 <= event.purged <= PURGE_BATCH:
            raise InvalidEvent(event, self.state, f"a purge page holds 0 to {PURGE_BATCH} jobs, got {event.purged}")
        self._maintenance.page_purged(event.purged, event.now, running=self.state is State.RUNNING)
        self.stats.purged += event.purged
        return []

    def _on_stats_rolled_up(self, event: ev.StatsRolledUp) -> list[cmd.Command]:
        if not 0 <= event.rolled <= ROLLUP_BATCH:
            raise InvalidEvent(event, self.state, f"a rollup page holds 0 to {ROLLUP_BATCH} attempts, got {event.rolled}")
        self._maintenance.page_rolled_up(event.rolled, event.now, running=self.state is State.RUNNING)
        self.stats.rolled_up += event.rolled
        return []

    def _on_lease_reconciled(self, event: ev.LeaseReconciled) -> list[cmd.Command]:
        given_back_held = event.released & self._slots.held_attempts()
        if given_back_held:
            raise InvalidEvent(event, self.state, f"the store gave back attempts this pump holds: {sorted(given_back_held)}")
        self._claims.reconciled()
        self.stats.reconciled += len(event.released)
        self._release_again_later(event.busy, event.now)
        return self._claim(event.now) if self.state is State.RUNNING else []

    def _on_jobs_released(self, event: ev.JobsReleased) -> list[cmd.Command]:
        self._release_again_later(event.busy, event.now)
        return []

    def _release_again_later(self, busy: frozenset[int], now: float) -> None:
        if busy and self.lease_id is not None:
            due = now + self.options.poll_interval
            self._releases_again.update(dict.fromkeys(busy, due))

    def _release_again(self, now: float) -> list[cmd.Command]:
        """ReleaseJobs of the busy releases now due (******** in the transition table)."""
        due = tuple(sorted(job_id for job_id, at in self._releases_again.items() if at <= now))
        if not due or self.lease_id is None:
            return []
        for job_id in due:
            del self._releases_again[job_id]
        self.stats.released_again += 1
        return [cmd.ReleaseJobs(lease_id=self.lease_id, job_ids=due)]

    def _on_overruns_forgotten(self, event: ev.OverrunsForgotten) -> list[cmd.Command]:
        self._overruns.forgotten()
        return self._forget_overruns(event.now)  # handlers that returned meanwhile

    def _on_lease_released(self, event: ev.LeaseReleased) -> list[cmd.Command]:
        self._ledger.landed(cmd.ReleaseLease)
        self._give_up_lease()
        self.lease_id = None
        self.state = State.STOPPED
        return []

    def _on_store_failed(self, event: ev.StoreFailed) -> list[cmd.Command]:
        failed = event.command
        if not isinstance(failed, cmd.Command):
            raise InvalidEvent(event, self.state, f"unknown command {failed!r}")
        if type(failed) not in UNTRACKED and not self._ledger.busy(type(failed)):
            raise InvalidEvent(event, self.state, f"{type(failed).__name__} is not in flight")
        if not 0.0 <= event.jitter < 1.0:
            raise InvalidEvent(event, self.state, f"jitter must be in [0, 1), got {event.jitter}")
        self.stats.store_faults += 1
        retry_at = self._faults.retry_at(
            now=event.now, jitter=event.jitter, base=self.options.poll_interval, cap=self.options.fault_backoff_cap
        )
        if isinstance(failed, (cmd.ReleaseLease, cmd.ReleaseJobs)):
            if self.state is State.DRAINING:
                # Give up: the lease lapses and maintenance anywhere gives the jobs back. A
                # ReleaseLease sent behind a failed ReleaseJobs still answers: a stale result.
                if isinstance(failed, cmd.ReleaseLease):
                    self._ledger.failed(cmd.ReleaseLease)
                self._give_up_lease()
                self.state = State.STOPPED
            elif isinstance(failed, cmd.ReleaseJobs):
                # The jobs it gave back (claimed ahead, behind a handler past its deadline) may
                # still run under the live lease, and the driver no longer holds them: without a
                # reconcile they would sit there, never executed, while the heartbeat goes on.
                self._claims.reconcile_needed = True
            return []
        if undo := _UNDO.get(type(failed)):  # ExpireLeases, MintSchedules, PurgePumps, PurgeTaskStats: none
            undo(self, retry_at)
        if self.state is State.DRAINING and self._drain.past_deadline(event.now):
            self._give_up_lease(drop_buffer=True)
            self.state = State.STOPPED
        return []

    def _on_drain_requested(self, event: ev.DrainRequested) -> list[cmd.Command]:
        if self.state is State.DRAINING:
            return []
        if self.state is not State.RUNNING:
            # Nothing held. If an OpenLease is in flight, LeaseOpened will release the new lease.
            self.state = State.STOPPED
            return []
        self.state = State.DRAINING
        self._drain.deadline = event.now + event.timeout
        # Jobs claimed ahead have not started: they go back now, for another worker to run.
        return self._release_claimed_ahead() + self._drain_step(event.now)

    # ---- undoing a failed command's bookkeeping (the failure is counted already) -------------

    def _undo_write(self, retry_at: float) -> None:
        self._outcomes.write_failed(retry_at)
        self._claims.retry_no_sooner_than(retry_at)  # the poll after it writes the batch again

    # ---- decisions ----------------------------------------------------------------------------

    def _on_due(self, now: float) -> list[cmd.Command]:
        commands: list[cmd.Command] = []
        if not self._lease.trusted(now):
            # No renewal has landed for a whole lease: another node may already have expired
            # it and re-run our jobs. Stop writing for them and start over.
            return self._lose_lease(now)
        commands += self._end_overdue(now)
        commands += self._forget_overruns(now)  # after a failed one
        commands += self._release_again(now)
        if self.state is State.DRAINING:
            commands += self._drain_step(now)
        elif now >= self._claims.next_poll:
            self._claims.next_poll = now + self.options.poll_interval
            # The claim is sized before the buffer drains, so buffered outcomes keep their slots.
            if not self._claim_limit and self.free_slots:
                commands += self._claim(now)
            commands += self._flush(now, then_claim=False)
        elif (linger_due := self._outcomes.linger_due) is not None and now >= linger_due:
            # A timer, unlike a finished job or a landed write: it also waits out a fault's backoff.
            commands += self._flush(now, then_claim=True)
        commands += self._lease.heartbeat(now, self.lease_id)
        if self.state is State.RUNNING:
            commands += self._maintenance.due(now)
        return commands

    def _end_overdue(self, now: float) -> list[cmd.Command]:
        """Attempts past their deadline end now, without their handlers (see ** in transitions)."""
        ended = self._slots.end_overdue(now)
        if not ended:
            return []
        for outcome in ended:  # their handlers go on, and count against their limits until they return
            self._overruns.ended_without_handler(outcome.job_id, outcome.attempt)
        self.stats.abandoned += len(ended)
        commands: list[cmd.Command] = [cmd.StopAttempt(job_id=o.job_id, attempt=o.attempt, reason=o.reason) for o in ended]
        # A handler past its deadline may never return its thread: the jobs claimed ahead go
        # back rather than wait behind it (claims_ahead stays off while it holds the thread).
        commands += self._release_claimed_ahead()
        if self.state is State.RUNNING and (self._outcomes.full or not self._slots.executing):
            commands += self._flush(now, then_claim=True)
        return commands

    def _run(self, jobs: tuple[ClaimedJob, ...], now: float) -> list[cmd.Command]:
        """Start the jobs a claim returned; at the end of the pass, write the outcomes that
        waited for it (the next claim rides that write), else claim again if more is waiting."""
        buffered = len(self._outcomes.waiting)
        commands = self._slots.start(jobs, now)
        if len(self._outcomes.waiting) > buffered and (self._outcomes.full or not self._slots.executing):
            commands += self._flush(now, then_claim=False)  # jobs cancelled before they started
        self._claims.next_poll = now + self.options.poll_interval
        if self._claim_limit:
            return commands  # the rest of this pass is still on its way
        # With room left, claim again now, leaving out the queues this pass found empty (their
        # share goes to the others); with none, the claim that rides the next outcome write picks
        # the rest up (a tick now would only flush a half-full buffer).
        skip = self._claims.end()
        # Outcomes that came due while the pass was in flight waited for it (see _flush). Due
        # still with its jobs started (they run past a round-trip), they go now with the next
        # claim; short jobs make them wait for the idle pool, so the two share one write.
        if self._write_due(now) and (flushed := self._flush(now, then_claim=True)):
            return commands + flushed
        if skip is not None and self.free_slots:
            commands += self._claim(now, skip=skip)
        return commands

    def _claim(self, now: float, *, skip: frozenset[str] = frozenset()) -> list[cmd.Command]:
        limit = min(self.free_slots, self.options.max_claim_batch)
        if limit <= 0 or self._claim_limit or self.state is not State.RUNNING or not self._lease.trusted(now):
            return []
        return self._claims.send(now, limit, self.lease_id, self._slots.held_attempts, skip)

    def _write_due(self, now: float) -> bool:
        """Whether the outcomes waiting are due for a write: a full batch, an idle pool, the
        oldest has lingered ``outcome_linger`` (and any fault backoff has passed), or the pool
        is not expected to go idle within a round-trip (so lingering would gain nothing)."""
        outcomes = self._outcomes
        if not outcomes.writable(now):
            return False  # nothing, or only busy outcomes not due again yet (their linger is)
        if outcomes.full or not self._slots.executing:
            return True
        linger_due = outcomes.linger_due
        if linger_due is None:
            return False
        if now >= linger_due:
            return True
        # The linger is there to let jobs finishing together share a write (the idle pool's
        # flush). When some job is expected to run on past a round-trip from now (longer jobs
        # than a round-trip, or a long one beside short ones), waiting for an idle pool would
        # only keep the finished jobs' slots empty: the write goes now, and the outcomes that
        # arrive while it is in flight go with the next one.
        idle_at = self._slots.expected_idle_at()
        horizon = outcomes.round_trip
        return horizon is not None and idle_at is not None and idle_at > now + horizon

    def _flush(self, now: float, *, then_claim: bool) -> list[cmd.Command]:
        if then_claim and self._claim_limit and self.state is State.RUNNING:
            # A write that would carry a claim waits while one is in flight: sent now it would
            # go alone, and the claim for the slots it frees would follow on a round-trip of its
            # own. The claim's answer comes next on the pump's one connection, and ClaimReturned
            # sends the write with that claim riding it (a failed claim's retry tick sends it).
            return []
        # Self-fenced, these outcomes are not ours to write any more: the tick that is due at
        # once (next_wakeup is past) drops them and starts over with a new lease.
        commands = self._outcomes.write(now, self.lease_id) if self._lease.trusted(now) else []
        if commands and then_claim and self.state is State.RUNNING and not self._claim_limit:
            if (limit := self._slots.claimable_after_write()) > 0:
                commands += self._claims.send(now, limit, self.lease_id, self._slots.held_attempts)
        return commands

    def _forget_overruns(self, now: float) -> list[cmd.Command]:
        if self.state not in (State.RUNNING, State.DRAINING) or not self._lease.trusted(now):
            return []
        return self._overruns.send(now, self.lease_id)

    def _release_claimed_ahead(self) -> list[cmd.Command]:
        return self._drain.give_back(self._slots.give_back_queued(), self.lease_id)

    def _drain_step(self, now: float) -> list[cmd.Command]:
        return self._drain.step(now, self.lease_id, claiming=bool(self._claim_limit), trusted=self._lease.trusted(now))

    def _lose_lease(self, now: float) -> list[cmd.Command]:
        self._give_up_lease(drop_buffer=True)
        self.lease_id = None
        if self.state is State.DRAINING:
            self.state = State.STOPPED
            return []
        self.state = State.OPENING
        return self._lease.open(now)

    def _give_up_lease(self, *, drop_buffer: bool = False) -> None:
        """Stop working under the lease: abandon what runs, and wait for nothing sent under it
        (whatever is in flight will come back as a stale result)."""
        self.stats.abandoned += self._slots.abandon_all()
        self._overruns.lease_lost()
        if drop_buffer:
            self._outcomes.clear()
        self._claims.lease_lost()
        self._releases_again.clear()  # they go with the lease
        self._ledger.lease_lost(STALE_TOLERANT)

    # The fault hooks (tests/faults/hooks.py) replace this method and set the attribute below.
    def _trust_lease_from(self, sent_at: float) -> None:
        self._lease.trust_from(sent_at)

    @property
    def _lease_trusted_until(self) -> float:
        return self._lease.trusted_until

    @_lease_trusted_until.setter
    def _lease_trusted_until(self, until: float) -> None:
        self._lease.trusted_until = until


_HANDLERS = {
    ev.Started: NodeDriver._on_started,
    ev.LeaseOpened: NodeDriver._on_lease_opened,
    ev.Tick: NodeDriver._on_tick,
    ev.HintReceived: NodeDriver._on_hint,
    ev.CancelRequested: NodeDriver._on_cancel_requested,
    ev.ClaimReturned: NodeDriver._on_claim_returned,
    ev.JobFinished: NodeDriver._on_job_finished,
    ev.OutcomesWritten: NodeDriver._on_outcomes_written,
    ev.LeaseRenewed: NodeDriver._on_lease_renewed,
    ev.LeasesExpired: NodeDriver._on_leases_expired,
    ev.SchedulesMinted: NodeDriver._on_schedules_minted,
    ev.JobsPurged: NodeDriver._on_jobs_purged,
    ev.StatsRolledUp: NodeDriver._on_stats_rolled_up,
    ev.PumpsPurged: NodeDriver._on_nothing_to_do,
    ev.TaskStatsPurged: NodeDriver._on_nothing_to_do,
    ev.TablesAnalyzed: NodeDriver._on_nothing_to_do,
    ev.JobsReleased: NodeDriver._on_jobs_released,
    ev.LeaseReleased: NodeDriver._on_lease_released,
    ev.OverrunsForgotten: NodeDriver._on_overruns_forgotten,
    ev.LeaseReconciled: NodeDriver._on_lease_reconciled,
    ev.StoreFailed: NodeDriver._on_store_failed,
    ev.DrainRequested: NodeDriver._on_drain_requested,
}

# What a StoreFailed of each command undoes; a command missing here left nothing to undo.
_UNDO = {
    cmd.OpenLease: lambda driver, retry_at: driver._lease.open_failed(retry_at),
    cmd.ClaimJobs: lambda driver, retry_at: driver._claims.failed(retry_at),
    cmd.WriteOutcomes: NodeDriver._undo_write,
    cmd.ReconcileLease: lambda driver, retry_at: driver._claims.reconcile_failed(retry_at),
    cmd.RenewLease: lambda driver, retry_at: driver._lease.renew_failed(retry_at),
    cmd.PurgeJobs: lambda driver, retry_at: driver._maintenance.purge_failed(),
    cmd.RollUpStats: lambda driver, retry_at: driver._maintenance.rollup_failed(),
    cmd.ForgetOverruns: lambda driver, retry_at: driver._overruns.forget_failed(retry_at),
}

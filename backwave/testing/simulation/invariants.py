"""What must hold after every step of a simulated run, and the report when it does not.

Beyond the store's own rows (no job lost, no outcome applied twice, no pump over its pool,
concurrency limits, one live lease per running attempt), the checks the widening added:

- no job whose handler never failed ends failed on attempts lost only to other jobs that killed
  their process (``process_killed_by``), but for the cases README's "What a crash costs" names:
  a crash costs the job that crashed, not its batch-mates;
- a task_finished receiver sees only outcomes that were applied, each once (``notified``,
  ``written``, ``over``); a transition observer sees each applied outcome and lapse once, by
  its attempt row, and nothing the fence refused (``transition_delivered``, ``over``);
- once every job has finished and every pump is at rest, no pump keeps anything of an attempt
  it will never hear of again (``at_rest``);
- with ``Config.job_control``: the handlers actually running per key and per queue, those that
  outlive their ended attempt (past a time limit, a cancel ignored) included, stay within the
  per-key and concurrency limits while their worker's lease is live (``_check_handler_limits``);
  a unique key is held by one job from its enqueue while it stays in the covered states, and
  the store's key column agrees (``unique_enqueued``, ``_check_unique``); a cancelled job never
  starts an attempt after its cancel applied (``cancel_applied``, ``started``); each named
  observer sees each applied transition, a cancel that applied at once included, and never a
  refused one (``transition_delivered``, ``over``);
- and in world.py: a claimed job finds a free worker thread at once, only the pump's own thread
  reads its driver, and a statement the pump sends is never refused (a refusal halts the pump).
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backwave.testing.memory_store import MemoryDatabase

    from .world import Node, SimPump, World

FINAL = frozenset({"succeeded", "failed", "cancelled", "quarantined"})
# The attempt row a transition of each kind goes with (both are written by one statement).
_ATTEMPT_OF_TRANSITION = {
    "succeeded": "succeeded",
    "failed": "failed",
    "retried": "failed",
    "quarantined": "quarantined",
    "lapsed": "lapsed",
    "cancelled": "cancelled",
}
# Attempt rows no observer can watch: a snooze is not a transition (the job only waits again).
_UNOBSERVABLE_ATTEMPTS = frozenset({"snoozed"})


class SimulationBug(AssertionError):
    """An invariant broke, the driver refused an event, or the store refused a statement."""


class Invariants:
    """The checks, and the bookkeeping they need beyond the store's own tables."""

    def __init__(self, world: World):
        self.world = world
        self.pool_size = world.options.pool_size
        # The most jobs a pump may hold: its threads, and the jobs claimed ahead waiting for them.
        self.held_at_most = world.options.pool_size + world.options.jobs_ahead
        self.enqueued: dict[int, MemoryDatabase] = {}  # job id -> the database it lives on
        self.final: dict[int, str] = {}  # job id -> the final state it first reached
        self.crashers: set[int] = set()  # jobs whose every attempt kills its process
        # (job, attempt) -> (the other job whose crash killed it, whether that crash may cost it the attempt)
        self.lost_to: dict[tuple[int, int], tuple[int, bool]] = {}
        # task_finished as receivers saw it, and the outcomes the store applied or refused, both
        # by (job, attempt, the lease the attempt ran under).
        self.notifications: Counter[tuple[int, int, uuid.UUID]] = Counter()
        self.applied: set[tuple[int, int, uuid.UUID]] = set()
        # (observer (None: the one unnamed), job, attempt) -> the transition that observer saw; a
        # job cancelled at once (no attempt ran into it) has "at once" for its attempt.
        self.delivered: dict[tuple[str | None, int, int | str], str] = {}
        self.lease_owner: dict[uuid.UUID, SimPump] = {}
        self.claimed_under: dict[tuple[int, int], uuid.UUID] = {}  # (job, attempt) -> lease
        self.executing: dict[int, list[tuple[SimPump, uuid.UUID, int]]] = {}  # job -> (pump, lease, attempt) per live worker
        # Admission: every claim seen (job, attempt, when), and the starts per (queue, rate window).
        self.starts_seen: set[tuple[int, int, object]] = set()
        self.starts: Counter[tuple] = Counter()  # (database, queue, limit key or None, window number)
        # Job control: the limit key of each job that ran; the attempt each cancelled job was at
        # when the operator's cancel applied; uniqueness: the key each unique job was enqueued
        # under with the states it covers, and the job that holds each key now.
        self.overrunning: set[tuple[int, int, int]] = set()  # (id of the pump, job, attempt) of handlers past their attempt
        self.limits_of: dict[int, tuple[str, str | None]] = {}  # job -> (queue, limit key)
        self.cancelled_at: dict[int, int] = {}
        self.unique_of: dict[int, tuple[tuple, frozenset[str]]] = {}
        self.unique_holder: dict[tuple, int] = {}

    # ---- after every driver step --------------------------------------------------------------

    def check_driver(self, pump: SimPump) -> None:
        if pump.driver.unreported > self.held_at_most:
            raise SimulationBug(
                f"{pump.name} holds {pump.driver.unreported} claimed-and-unreported jobs, pool_size + jobs ahead is {self.held_at_most}"
            )

    # ---- after every statement ----------------------------------------------------------------

    def check_store(self) -> None:
        for db in self.world.databases:
            self._check_database(db)
        self._check_executions()
        self._check_handler_limits()

    def _check_database(self, db: MemoryDatabase) -> None:
        per_lease: Counter[uuid.UUID] = Counter()
        per_queue: Counter[str] = Counter()
        per_key: Counter[tuple[str, str]] = Counter()
        suspects: Counter[uuid.UUID] = Counter()
        ancestors_of: dict[int, list[tuple[int, str]]] | None = None  # built on first need
        for job_id, home in self.enqueued.items():
            if home is not db:
                continue
            job = db.jobs.get(job_id)
            if job is None:
                if job_id not in self.final:
                    raise SimulationBug(f"job {job_id} is gone without having finished: lost")
                continue
            state = job.state
            if state in FINAL:
                if job_id not in self.final and state == "failed":
                    self._check_not_charged_for_others(db, job_id)
                first = self.final.setdefault(job_id, state)
                if first != state:
                    raise SimulationBug(f"job {job_id} finished as {first}, and is now {state}: an outcome applied twice")
            elif job_id in self.final:
                raise SimulationBug(f"job {job_id} finished as {self.final[job_id]} and is {state} again: resurrected")
            if state == "running":
                if job.lease_id not in db.leases:
                    raise SimulationBug(
                        f"job {job_id} runs under lease {job.lease_id}, which no longer exists: no one can ever free it (lost)"
                    )
                per_lease[job.lease_id] += 1
                per_queue[job.queue] += 1
                if job.limit_key is not None:
                    per_key[job.queue, job.limit_key] += 1
                self._count_start(db, job)
            if job.attempts - job.forgiven_attempts > job.max_attempts:
                raise SimulationBug(
                    f"job {job_id} is at attempt {job.attempts} ({job.forgiven_attempts} forgiven) of {job.max_attempts}"
                )
            if not 0 <= job.forgiven_attempts <= job.attempts:
                raise SimulationBug(f"job {job_id} has {job.forgiven_attempts} forgiven attempts of {job.attempts}")
            if state == "running" and job.suspect:
                suspects[job.lease_id] += 1
            if ancestors_of is None and db.dependencies:
                ancestors_of = {}
                for (dependent, ancestor_id), (on_failure, _position) in db.dependencies.items():
                    ancestors_of.setdefault(dependent, []).append((ancestor_id, on_failure))
            if (
                ancestors_of
                and job_id in ancestors_of
                and (state in ("ready", "running", "succeeded") or (state in ("failed", "quarantined") and job.attempts))
            ):
                self._check_ancestors_done(db, job_id, state, ancestors_of[job_id])
            elif state == "cancelled" and job_id not in self.cancelled_at and not job.reason.startswith("Cancelled: ancestor #"):
                raise SimulationBug(
                    f"job {job_id} is cancelled without an ancestor's failure (reason {job.reason!r}) and the operator never cancelled it"
                )
            if job_id in self.unique_of:
                self._check_unique(job_id, job)
        for lease_id, running in per_lease.items():
            if running > self.held_at_most:
                owner = self.lease_owner.get(lease_id)
                raise SimulationBug(
                    f"{running} jobs run under the lease of {owner.name if owner else lease_id}, pool_size + jobs ahead is {self.held_at_most}"
                )
        for lease_id, running in suspects.items():
            if running > 1:
                owner = self.lease_owner.get(lease_id)
                raise SimulationBug(
                    f"{running} suspects run under the lease of {owner.name if owner else lease_id}: a second death would convict both"
                )
        for queue, running in per_queue.items():
            limit = db.queues.get(queue, (None, False))[0]
            if limit is not None and running > limit:
                raise SimulationBug(f"{running} jobs of queue {queue} run at once; its concurrency limit is {limit}")
        for (queue, key), running in per_key.items():
            limit = db.admission[queue].key_concurrency_limit if queue in db.admission else None
            if limit is not None and running > limit:
                raise SimulationBug(f"{running} jobs of key {key!r} run at once in queue {queue}; its per-key limit is {limit}")
        decisive: Counter[int] = Counter()
        for (job_id, number), attempt in db.attempts.items():
            if attempt.state == "succeeded":
                decisive[job_id] += 1
                if decisive[job_id] > 1:
                    raise SimulationBug(f"job {job_id} has two succeeded attempts: an outcome applied twice")
            job = db.jobs.get(job_id)
            if job is not None and number > job.attempts:
                raise SimulationBug(f"job {job_id} has an attempt row {number} past its attempt count {job.attempts}")

    def _check_unique(self, job_id: int, job) -> None:
        """A job holds its uniqueness key from its enqueue for as long as it stays in the states
        the key covers; leaving them, it lets go for good. The store's key column must say so."""
        key, covered = self.unique_of[job_id]
        holds = self.unique_holder.get(key) == job_id
        if holds and job.state not in covered:
            del self.unique_holder[key]
            holds = False
        if (job.unique_key is not None) != holds:
            raise SimulationBug(
                f"job {job_id} is {job.state} (its key covers {', '.join(sorted(covered))}) and the store "
                f"{'still holds' if job.unique_key is not None else 'no longer holds'} its uniqueness key {key[1:]}"
                f"{'' if holds else ', which it let go of'}"
            )

    def unique_enqueued(self, db: MemoryDatabase, spec, job_id: int, duplicate: bool) -> None:
        """A unique enqueue returned ``job_id`` (``duplicate``: a job that existed): the job that
        holds the key if one does, a new one if none does."""
        window = None
        if spec.unique_period is not None:
            window = math.floor(self.world._db_now().timestamp() / spec.unique_period)
        key = (id(db), spec.task_path, spec.unique_key, spec.unique_period, window)
        holder = self.unique_holder.get(key)
        if holder is not None and (db.jobs.get(holder) is None or db.jobs[holder].state not in self.unique_of[holder][1]):
            # It left the covered states since the last check (a purge leaves nothing to check).
            del self.unique_holder[key]
            holder = None
        shown = f"key {spec.unique_key!r} (period {spec.unique_period}, window {window})"
        if duplicate and holder != job_id:
            state = db.jobs[job_id].state if job_id in db.jobs else "gone"
            raise SimulationBug(
                f"a unique enqueue of {shown} returned job {job_id} ({state}), "
                + (f"but job {holder} holds that key" if holder is not None else "which let go of that key: a new job was due")
            )
        if not duplicate and holder is not None:
            raise SimulationBug(
                f"a unique enqueue of {shown} made job {job_id} while job {holder} holds that key "
                f"({db.jobs[holder].state}, covering {', '.join(sorted(self.unique_of[holder][1]))}): two jobs hold one key"
            )
        if not duplicate:
            # "ready" covers a job waiting for its ancestors, due or scheduled.
            self.unique_of[job_id] = (key, frozenset({*spec.unique_states, "waiting"}))
            self.unique_holder[key] = job_id

    def cancel_applied(self, job_id: int, attempt: int) -> None:
        """The operator's cancel of ``job_id`` applied while it was at ``attempt``: no later
        attempt of it may ever start a handler."""
        self.cancelled_at.setdefault(job_id, attempt)

    def _check_ancestors_done(self, db: MemoryDatabase, job_id: int, state: str, ancestors: list[tuple[int, str]]) -> None:
        """A dependent is claimable (and so ever ran) only once each ancestor has succeeded, or
        ended badly under on_failure "run"; an ancestor gone was purged after it ended."""
        for ancestor_id, on_failure in ancestors:
            ancestor = db.jobs.get(ancestor_id)
            if ancestor is None or ancestor.state == "succeeded" or (on_failure == "run" and ancestor.state in FINAL):
                continue
            raise SimulationBug(
                f"job {job_id} is {state} while its ancestor {ancestor_id} is {ancestor.state} (on_failure {on_failure}): "
                "a dependent ran before all its ancestors succeeded"
            )

    def _count_start(self, db: MemoryDatabase, job) -> None:
        """A running job's claim, counted once against its queue's rate window (the window its
        start falls in, by the database clock); more starts in a window than the limit is a bug."""
        admission = db.admission.get(job.queue)
        if admission is None or admission.rate_period is None:
            return
        start = (job.id, job.attempts, job.last_attempted_at)
        if start in self.starts_seen:
            return
        self.starts_seen.add(start)
        period = admission.rate_period
        number = int(job.last_attempted_at.timestamp() // period)
        window = (id(db), job.queue, None, number)  # each database has its own queue rows
        self.starts[window] += 1
        if admission.rate_limit is not None and self.starts[window] > admission.rate_limit:
            raise SimulationBug(
                f"{self.starts[window]} jobs of queue {job.queue} started in one {period:g} s window; its rate limit is {admission.rate_limit}"
            )
        if admission.key_rate_limit is not None and job.limit_key is not None:
            key_window = (id(db), job.queue, job.limit_key, number)
            self.starts[key_window] += 1
            if self.starts[key_window] > admission.key_rate_limit:
                raise SimulationBug(
                    f"{self.starts[key_window]} jobs of key {job.limit_key!r} in queue {job.queue} started in one {period:g} s window;"
                    f" its per-key rate limit is {admission.key_rate_limit}"
                )

    def _check_not_charged_for_others(self, db: MemoryDatabase, job_id: int) -> None:
        """A job that just failed: if not one of its own handlers failed or crashed, and every
        attempt it had was lost when another job killed the process it ran in, then it may only
        have paid for the crashes the README's "What a crash costs" says it pays for: as a suspect,
        beside a crasher on another pump of the process or on the crasher's own first (forgiven)
        crash. Every other such attempt is owed to it, so it cannot have used up max_attempts."""
        if job_id in self.crashers:
            return
        attempts = [(number, row) for (owner, number), row in db.attempts.items() if owner == job_id]
        lost = [self.lost_to.get((job_id, number)) for number, row in attempts if row.state == "lapsed"]
        if not attempts or len(lost) < len(attempts) or None in lost:
            return
        paid = sum(1 for _, excused in lost if excused)
        if paid < db.jobs[job_id].max_attempts:
            culprits = sorted({culprit for culprit, _ in lost})
            raise SimulationBug(
                f"job {job_id} failed although its handler never failed: each of its {len(attempts)} attempt(s) lapsed when "
                f"job(s) {', '.join(map(str, culprits))} killed the worker process it ran in, {paid} of them as a suspect the "
                f"crash may cost, of {db.jobs[job_id].max_attempts} attempts (a batch-mate charged for another job's crash)"
            )

    def process_killed_by(self, culprit: int, node: Node) -> None:
        """Job ``culprit``'s handler killed ``node``'s process: every other job running under the
        lease its pump holds loses that attempt because of it (a lease the pump had already given
        up was lapsing anyway). Noted with it: whether the crash may cost that job the attempt
        (see _check_not_charged_for_others; a store without suspects has no such case)."""
        held = {pump.driver.lease_id: pump for pump in node.pumps.values() if pump.alive and pump.driver.lease_id is not None}
        # The crasher's row may be gone: a handler given up on (its lease lost, its time up) can
        # crash after its job ran again elsewhere, finished and was purged. It then runs beside
        # nobody under a live lease, as a suspect of none.
        crasher = self.enqueued[culprit].jobs.get(culprit)
        crasher_suspect = getattr(crasher, "suspect", False)
        crasher_lease = getattr(crasher, "lease_id", None)
        for db in self.world.databases:
            for job in db.jobs.values():
                if job.state == "running" and job.id != culprit and job.lease_id in held:
                    beside = job.lease_id == crasher_lease
                    excused = getattr(job, "suspect", False) and (not beside or not crasher_suspect)
                    self.lost_to[(job.id, job.attempts)] = (culprit, excused)

    # ---- task_finished receivers --------------------------------------------------------------

    def notified(self, pump: SimPump, job_id: int, attempt: int, lease: uuid.UUID, result: str) -> None:
        if not self.world.config.observers:
            return
        key = (job_id, attempt, lease)
        self.notifications[key] += 1
        if self.notifications[key] > 1:
            raise SimulationBug(f"task_finished was sent twice for attempt {attempt} of job {job_id} (on {pump.name})")

    def written(self, job_id: int, attempt: int, lease: uuid.UUID, applied: bool) -> None:
        if not self.world.config.observers:
            return
        key = (job_id, attempt, lease)
        if applied:
            self.applied.add(key)
        elif self.notifications[key]:
            raise SimulationBug(
                f"a task_finished receiver saw attempt {attempt} of job {job_id} end, and the fence then refused that outcome: "
                "receivers saw an outcome that never happened"
            )

    def over(self) -> None:
        """The run is over: every outcome that will ever be applied has been."""
        if not self.world.config.observers:
            return
        self._check_every_transition_delivered()
        unapplied = sorted(
            (job_id, attempt)
            for (job_id, attempt, lease), count in self.notifications.items()
            if count and (job_id, attempt, lease) not in self.applied
        )
        if unapplied:
            shown = ", ".join(f"{job_id}.{attempt}" for job_id, attempt in unapplied[:8])
            raise SimulationBug(
                f"task_finished receivers saw {len(unapplied)} attempt(s) end whose outcome was never applied ({shown}): "
                "given up with a lost lease, dropped, or refused"
            )

    # ---- transition observers ---------------------------------------------------------------

    def transition_delivered(self, db: MemoryDatabase, record, observer: str | None = None) -> None:
        """``observer`` received ``record``: it must be an outcome (or a lapse) the store applied,
        recorded by its attempt row, and the only transition of that attempt; or a cancel that
        applied at once (the job cancelled, no attempt of it ended so)."""
        row = db.attempts.get((record.job_id, record.attempt))
        at_once = record.kind == "cancelled" and (row is None or row.state != "cancelled")
        key = (observer, record.job_id, "at once" if at_once else record.attempt)
        who = "observers" if observer is None else f"observer {observer}"
        if key in self.delivered:
            raise SimulationBug(
                f"{who} saw attempt {record.attempt} of job {record.job_id} end twice ({self.delivered[key]}, then {record.kind})"
            )
        if at_once:
            job = db.jobs.get(record.job_id)
            if job is None or job.state != "cancelled":
                raise SimulationBug(
                    f"{who} saw job {record.job_id} cancelled, and it is {'gone' if job is None else job.state}: a refused cancel"
                )
            self.delivered[key] = record.kind
            return
        expected = _ATTEMPT_OF_TRANSITION[record.kind]
        if row is None or row.state != expected:
            shown = "no attempt row" if row is None else f"its attempt row says {row.state}"
            raise SimulationBug(
                f"an observer saw attempt {record.attempt} of job {record.job_id} end {record.kind}, and {shown}: "
                "observers saw an outcome that was never applied (a refused one?)"
            )
        self.delivered[key] = record.kind

    def _check_every_transition_delivered(self) -> None:
        """Each observer saw each applied transition (at least once: the checks above make it
        exactly once, no delivery failing here), a cancel that applied at once included."""
        from .world import OBSERVERS

        named = self.world.config.job_control
        for observer in OBSERVERS if named else (None,):
            missed = sorted(
                key
                for db in self.world.databases
                for key, row in db.attempts.items()
                if (observer, *key) not in self.delivered and row.state not in _UNOBSERVABLE_ATTEMPTS
            )
            if named:  # cancels are watched too
                missed += sorted(
                    (job_id, "at once")
                    for job_id, state in self.final.items()
                    if state == "cancelled"
                    and (job := self.enqueued[job_id].jobs.get(job_id)) is not None
                    and getattr(self.enqueued[job_id].attempts.get((job_id, job.attempts)), "state", None) != "cancelled"
                    and (observer, job_id, "at once") not in self.delivered
                )
            if missed:
                shown = ", ".join(f"{job_id}.{attempt}" for job_id, attempt in missed[:8])
                raise SimulationBug(
                    f"{len(missed)} applied transition(s) reached no observer {observer or ''} ({shown}): never noted, or lost"
                )

    # ---- the pumps at rest --------------------------------------------------------------------

    def at_rest(self) -> None:
        """Every job finished, every live pump idle: whatever a pump still keeps of an attempt now,
        it keeps for ever. The shell keeps nothing (a report rides on its outcome and goes with
        it); the driver remembers each attempt it gave up until that attempt's handler returns."""
        for pump in self.world.pumps:
            if pump.alive and (kept := pump.driver._abandoned):
                shown = ", ".join(f"{job_id}.{attempt}" for job_id, attempt in sorted(kept)[:8])
                raise SimulationBug(
                    f"{pump.name} is at rest and still keeps {len(kept)} attempt(s) it will never hear of again ({shown}): "
                    "what a pump keeps of abandoned attempts piles up for ever"
                )

    def restless(self, deadline: float) -> None:
        lines = []
        for pump in self.world.pumps:
            if pump.alive and not self.world.at_rest(pump):
                lines.append(
                    f"  {pump.name}: {len(pump.handlers)} handler(s) running, {pump.driver.unreported} job(s) held, driver {pump.driver.state.value}"
                )
        raise SimulationBug(f"every job finished, yet not every pump came to rest by t={deadline:.1f}:\n" + "\n".join(lines))

    # ---- handlers on workers ------------------------------------------------------------------

    def started(
        self, pump: SimPump, job_id: int, lease: uuid.UUID, attempt: int, limits: tuple[str, str | None] | None = None
    ) -> None:
        if job_id in self.cancelled_at and attempt > self.cancelled_at[job_id]:
            raise SimulationBug(
                f"{pump.name} started attempt {attempt} of job {job_id}, whose cancel applied at attempt {self.cancelled_at[job_id]}: "
                "a cancelled job ran again"
            )
        self.executing.setdefault(job_id, []).append((pump, lease, attempt))
        if limits is not None:
            self.limits_of[job_id] = limits
        # A pump's pool has pool_size threads: a handler beyond them would wait in the pool's
        # queue, unstarted, where the driver thinks it runs (its deadline ticking). Abandoned
        # handlers still hold theirs; jobs claimed ahead wait in the driver, not in the pool.
        handlers = sum(1 for runs in self.executing.values() for runner, _, _ in runs if runner is pump)
        if handlers > self.pool_size:
            raise SimulationBug(
                f"{pump.name} runs {handlers} handlers at once (abandoned ones included), pool_size is {self.pool_size}"
            )
        self._check_executions()
        self._check_handler_limits()

    def finished(self, pump: SimPump, job_id: int, attempt: int) -> None:
        runs = self.executing.get(job_id, [])
        for index, (runner, _, number) in enumerate(runs):
            if runner is pump and number == attempt:
                del runs[index]
                break

    def outlived(self, pump: SimPump, job_id: int, attempt: int) -> None:
        """The driver ended this attempt past its deadline while its handler runs on: the row is
        no longer the attempt's to own, though the handler still counts against its limits."""
        self.overrunning.add((id(pump), job_id, attempt))

    def died(self, pump: SimPump) -> None:
        for runs in self.executing.values():
            runs[:] = [run for run in runs if run[0] is not pump]

    def _check_handler_limits(self) -> None:
        """Handlers actually running count against their queue's concurrency limit and their
        key's per-key limit, those whose attempt already ended included (past a time limit, a
        cancel they ignored: abandoned until they return), as long as their worker's lease is
        live: a dead or cut-off worker holds nothing (docs/how-to/admission.md)."""
        if not self.world.config.job_control:
            return
        now = self.world._db_now()
        per_queue: Counter[tuple[int, str]] = Counter()
        per_key: Counter[tuple[int, str, str]] = Counter()
        ended: Counter[tuple] = Counter()
        databases = {}
        for job_id, runs in self.executing.items():
            if not runs:
                continue
            db = self.enqueued[job_id]
            databases[id(db)] = db
            job = db.jobs.get(job_id)
            for _, lease, number in runs:
                row = db.leases.get(lease)
                if row is None or row.expires_at <= now:
                    continue
                queue, key = self.limits_of[job_id]
                over = job is None or job.state != "running" or job.attempts != number or job.lease_id != lease
                per_queue[id(db), queue] += 1
                ended[id(db), queue] += over
                if key is not None:
                    per_key[id(db), queue, key] += 1
                    ended[id(db), queue, key] += over
        for (db_id, queue), running in per_queue.items():
            limit = databases[db_id].queues.get(queue, (None, False))[0]
            if limit is not None and running > limit:
                raise SimulationBug(
                    f"{running} handlers of queue {queue} run at once ({ended[db_id, queue]} of them of attempts already ended: "
                    f"abandoned past a time limit or a cancel); its concurrency limit is {limit}"
                )
        for (db_id, queue, key), running in per_key.items():
            admission = databases[db_id].admission.get(queue)
            limit = admission.key_concurrency_limit if admission is not None else None
            if limit is not None and running > limit:
                raise SimulationBug(
                    f"{running} handlers of key {key!r} run at once in queue {queue} ({ended[db_id, queue, key]} of them of "
                    f"attempts already ended: abandoned past a time limit or a cancel); its per-key limit is {limit}"
                )

    def _check_executions(self) -> None:
        """An attempt running under a live lease owns its row: the row runs under that lease, at
        that attempt. So no row is ever under two live leases at once, and no write (a late one,
        a stale one) can finish or release a job while a live attempt of it runs."""
        now = self.world._db_now()
        for job_id, runs in self.executing.items():
            db = self.enqueued[job_id]
            live = [
                (pump, lease, number)
                for pump, lease, number in runs
                if (row := db.leases.get(lease)) is not None
                and row.expires_at > now
                and (id(pump), job_id, number) not in self.overrunning
            ]
            if not live:
                continue
            if len({lease for _, lease, _ in live}) > 1:
                names = ", ".join(f"{pump.name} (attempt {number})" for pump, _, number in live)
                raise SimulationBug(f"job {job_id} runs on {names} under {len(live)} live leases at once")
            job = db.jobs.get(job_id)
            pump, lease, number = live[0]
            if job is None or job.state != "running" or job.lease_id != lease or job.attempts != number:
                shown = "gone" if job is None else f"{job.state}, attempt {job.attempts}"
                raise SimulationBug(
                    f"job {job_id} is {shown} while attempt {number} of it still runs on {pump.name} under a live lease: "
                    "a write changed a row its lease still holds"
                )

    # ---- the quiesce ----------------------------------------------------------------------------

    def all_finished(self) -> bool:
        return all(job_id in self.final or db.jobs[job_id].state in FINAL for job_id, db in self.enqueued.items())

    def stuck(self, deadline: float) -> None:
        """Raise the report of every job that did not reach a final state by ``deadline``."""
        lines = []
        for job_id in sorted(self.enqueued):
            db = self.enqueued[job_id]
            job = db.jobs.get(job_id)
            if job is None or job.state in FINAL:
                continue
            where = ""
            if job.lease_id is not None:
                owner = self.lease_owner.get(job.lease_id)
                lease = db.leases.get(job.lease_id)
                where = f" under lease {job.lease_id.hex[:8]} of {owner.name if owner else '?'}"
                if owner is not None:
                    where += f" (pump {'alive' if owner.alive else 'dead'}, driver {owner.driver.state.value}, knows the job: {job_id in owner.driver._executing})"
                if lease is not None:
                    where += f", lease expires at +{(lease.expires_at - self.world._db_now()).total_seconds():.1f}s"
            lines.append(f"  job {job_id}: {job.state}, attempt {job.attempts}/{job.max_attempts}{where}")
        raise SimulationBug(
            f"not every job reached a final state by t={deadline:.1f} (faults stopped at {self.world.scenario.fault_phase:.1f}):\n"
            + "\n".join(lines)
        )

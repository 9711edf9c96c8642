"""The simulated world: nodes, pumps running the real Node Driver, one in-memory database.

Theory of operation
-------------------
A discrete-event simulation on virtual time. Every action (a pump's next step, a statement
reaching the database, its answer coming back, a handler finishing, a hint, a fault) is an entry
in one heap keyed by its virtual time; entries at the same instant are ordered by a draw of the
seed's random source, so that one source decides every interleaving, every latency, every
handler's duration and outcome, and every fault. Nothing reads the host clock.

Each simulated pump is a shell around a real ``NodeDriver`` that behaves as the production pump
does (``backwave/shell/pump.py``): one event at a time, its commands in order, a WriteOutcomes
followed by a ClaimJobs sent as one ``write_outcomes_then_claim``, one store call in flight,
handlers on a pool that posts ``JobFinished``. A store call is split in two: the statement runs
against the InMemoryStore when the request reaches the database, and the answer reaches the
driver a latency later, so other pumps' statements, lapses and crashes fall in between.

The node's clock (the driver's ``now``) is the virtual time plus a per-node offset that clock
jumps move forward; the database clock is the virtual time itself.
"""

from __future__ import annotations

import heapq
import random
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import InvalidEvent, NodeDriver, State
from backwave.core.jobs import ClaimedJob
from backwave.store.contract import NewJob, OutcomeRecord, StoreError
from backwave.store.memory import InMemoryStore, MemoryDatabase

from .faults import Faults
from .invariants import Invariants, SimulationBug
from .logbook import Logbook, fmt_command, fmt_event
from .scenario import CRASH_TASK, TASK, Config, Scenario

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class Node:
    """A worker process: its pumps share its clock and die with it."""

    __slots__ = ("index", "incarnation", "offset", "alive", "pumps")

    def __init__(self, index: int):
        self.index = index
        self.incarnation = 0
        self.offset = 0.0
        self.alive = True
        self.pumps: dict[int, SimPump] = {}  # pump slot -> the pump running in it


class SimPump:
    """One pump of a node: the driver, its event channel, its pending commands."""

    __slots__ = (
        "name", "node", "driver", "worker_id", "channel", "pending", "busy", "paused_until", "step_scheduled",
        "wake_at", "stopped", "running", "store", "begun",
    )

    def __init__(self, name: str, node: Node, driver: NodeDriver, store: InMemoryStore):
        self.name = name
        self.node = node
        self.driver = driver
        self.worker_id = name
        self.store = store
        self.channel: deque[ev.Event] = deque()
        self.pending: deque[cmd.Command] = deque()
        self.busy = False  # a store call is in flight
        self.paused_until = 0.0
        self.step_scheduled = False
        self.wake_at: float | None = None
        self.stopped = False
        self.begun = False  # Started is handled first, before anything in the channel
        self.running: dict[int, tuple[int, uuid.UUID]] = {}  # job id -> (attempt, lease) on its workers

    @property
    def alive(self) -> bool:
        return self.node.alive and not self.stopped


class World(Faults):
    """One seed's run. ``run()`` returns normally or raises SimulationBug."""

    def __init__(self, scenario: Scenario, config: Config, rng: random.Random, logbook: Logbook):
        self.scenario = scenario
        self.config = config
        self.rng = rng
        self.log = logbook
        self.t = 0.0
        self.options = scenario.options
        self.database = MemoryDatabase(now=self._db_now)
        self.invariants = Invariants(self)
        self.nodes = [Node(i) for i in range(scenario.nodes)]
        self.pumps: list[SimPump] = []
        self.quiescing = False
        self.outage_until = 0.0
        self.steps = 0
        self._heap: list = []
        self._seq = 0

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        for queue, limit in self.scenario.concurrency_limits.items():
            self.database.queues[queue] = (limit, False)
        for node in self.nodes:
            self._boot(node)
        for spec in self.scenario.jobs:
            self.at(spec.at, self._enqueue, spec)
        if self.config.faults:
            self.at(self.rng.expovariate(1 / self.scenario.fault_every), self._fault)
        self.at(self.scenario.fault_phase, self._quiesce)
        deadline = self.scenario.fault_phase + self.config.quiesce_limit
        while self._heap:
            when, _, _, action, args = heapq.heappop(self._heap)
            if when > deadline:
                self.invariants.stuck(deadline)
            self.t = when
            action(*args)
            self.steps += 1
            if self.quiescing and self.invariants.all_finished():
                self.log.line(self.t, "world", f"all {len(self.invariants.enqueued)} jobs finished after {self.steps} steps")
                return
        self.invariants.stuck(self.t)

    def at(self, when: float, action: Callable, *args) -> None:
        """Schedule ``action(*args)`` at virtual time ``when`` (ties ordered by a random draw)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.t), self.rng.random(), self._seq, action, args))

    def _db_now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t)

    def node_now(self, node: Node) -> float:
        return self.t + node.offset

    # ---- nodes and pumps ----------------------------------------------------------------------

    def _boot(self, node: Node) -> None:
        node.alive = True
        node.incarnation += 1
        node.pumps = {}
        for index in range(self.scenario.pumps_per_node):
            self._start_pump(node, index)

    def _start_pump(self, node: Node, index: int) -> None:
        name = f"n{node.index}.{node.incarnation}p{index}.{len(self.pumps)}"
        pump = SimPump(name, node, NodeDriver(self.options), InMemoryStore(self.database))
        node.pumps[index] = pump
        self.pumps.append(pump)
        self.log.line(self.t, name, "start")
        self.at(self.t + self.rng.uniform(0, 0.2), self._begin, pump)

    def _begin(self, pump: SimPump) -> None:
        if pump.alive:
            pump.begun = True
            self.handle(pump, ev.Started(now=self.node_now(pump.node)))
            self.kick(pump)

    def _post(self, pump: SimPump, kind, **fields) -> None:
        if pump.alive:
            pump.channel.append(kind(now=self.node_now(pump.node), **fields))
            self.kick(pump)

    def kick(self, pump: SimPump, when: float | None = None) -> None:
        """Make sure the pump takes its next step (now, or when its pause ends)."""
        if pump.step_scheduled:
            return
        pump.step_scheduled = True
        self.at(self.t if when is None else when, self._step, pump)

    def _step(self, pump: SimPump) -> None:
        pump.step_scheduled = False
        if not pump.alive or pump.busy or not pump.begun:
            return
        if self.t < pump.paused_until:
            self.kick(pump, pump.paused_until)
            return
        if pump.pending:
            self._run(pump)
        elif pump.channel:
            self.handle(pump, pump.channel.popleft())
        else:
            wake = pump.driver.next_wakeup()
            now = self.node_now(pump.node)
            if wake is None or wake > now:  # sleep until the driver's next deadline
                if wake is not None and pump.wake_at != wake:
                    pump.wake_at = wake
                    self.at(self.t + (wake - now), self._wake, pump, wake)
                return
            self.handle(pump, ev.Tick(now=now))
        self.kick(pump)

    def _wake(self, pump: SimPump, wake: float) -> None:
        if pump.alive and pump.wake_at == wake:
            pump.wake_at = None
            self.kick(pump)

    def handle(self, pump: SimPump, event: ev.Event) -> None:
        """Feed one event to the pump's driver and queue the commands it answers with."""
        try:
            commands = pump.driver.handle(event)
        except InvalidEvent as error:
            raise SimulationBug(f"{pump.name}: the driver refused an event: {error}") from error
        self.log.line(self.t, pump.name, f"{fmt_event(event)} -> {', '.join(map(fmt_command, commands)) or '-'}")
        pump.pending.extend(commands)
        self.invariants.check_driver(pump)
        if pump.driver.state is State.STOPPED and not pump.stopped:
            pump.stopped = True
            self.log.line(self.t, pump.name, "stopped")
            if pump.node.alive:  # the process starts a new pump in its place (a rolling restart)
                self.at(self.t + self.rng.uniform(0.1, 2.0), self._replace, pump)

    def _replace(self, stopped: SimPump) -> None:
        node = stopped.node
        for index, pump in node.pumps.items():
            if pump is stopped and node.alive:
                self._start_pump(node, index)
                return

    # ---- commands -----------------------------------------------------------------------------

    def _run(self, pump: SimPump) -> None:
        command = pump.pending.popleft()
        if isinstance(command, cmd.ExecuteJob):
            self._start_job(pump, command.job)
            return
        batch: tuple[cmd.Command, ...] = (command,)
        if isinstance(command, cmd.WriteOutcomes) and pump.pending and isinstance(pump.pending[0], cmd.ClaimJobs):
            batch = (command, pump.pending.popleft())  # pipelined, as the production pump does
        pump.busy = True
        self.at(self.t + self._latency(), self._statement, pump, batch, pump.node.incarnation)

    def _latency(self) -> float:
        return self.rng.expovariate(1 / 0.002) if self.rng.random() < 0.95 else self.rng.uniform(0.05, 0.5)

    def _statement(self, pump: SimPump, batch: tuple[cmd.Command, ...], incarnation: int) -> None:
        """The request reached the database: run it (it runs even if its node has died since)."""
        fault = self._fault_for_statement()
        if fault == "before":
            results = [(ev.StoreFailed, {"command": c, "jitter": self.rng.random()}) for c in batch]
        else:
            try:
                results = self._apply(pump, batch)
            except (StoreError, ValueError, TypeError) as error:  # a pump halts on any of these
                raise SimulationBug(f"{pump.name}: {' + '.join(type(c).__name__ for c in batch)} raised {type(error).__name__}: {error}") from error
            if _changed(results):
                self.invariants.check_store()
            if fault == "after":  # committed, but the answer is lost
                results = [(ev.StoreFailed, {"command": c, "jitter": self.rng.random()}) for c in batch]
        self.log.line(self.t, pump.name, f"db {'+'.join(type(c).__name__ for c in batch)}{' FAULT-' + fault if fault else ''}")
        self.at(self.t + self._latency(), self._answer, pump, results, incarnation)

    def _answer(self, pump: SimPump, results: list, incarnation: int) -> None:
        if not pump.node.alive or pump.node.incarnation != incarnation or pump.stopped:
            return
        if self.t < pump.paused_until:
            self.at(pump.paused_until, self._answer, pump, results, incarnation)
            return
        pump.busy = False
        now = self.node_now(pump.node)
        if results[0][0] is ev.StoreFailed and isinstance(results[0][1]["command"], cmd.WriteOutcomes):
            # As the production pump: the claims that follow a failed write were sized for the
            # slots it would have freed, so none of them runs (a Weighted pass has several).
            while pump.pending and isinstance(pump.pending[0], cmd.ClaimJobs):
                results = [*results, (ev.StoreFailed, {**results[-1][1], "command": pump.pending.popleft()})]
        for kind, fields in results:
            self.handle(pump, kind(now=now, **fields))
            if pump.stopped:
                return
        self.kick(pump)

    def _apply(self, pump: SimPump, batch: tuple[cmd.Command, ...]) -> list:
        """Run the batch against the store as the production pump's _call_store does."""
        store, command = pump.store, batch[0]
        if len(batch) == 2:
            claim = batch[1]
            applied, jobs = store.write_outcomes_then_claim(
                lease_id=command.lease_id, worker_id=pump.worker_id, outcomes=_records(command.outcomes), queues=claim.queues, limit=claim.limit
            )
            self._claimed(pump, claim, jobs)
            return [(ev.OutcomesWritten, {"applied": frozenset(applied)}), (ev.ClaimReturned, {"jobs": tuple(jobs)})]
        match command:
            case cmd.ClaimJobs():
                jobs = store.claim_jobs(lease_id=command.lease_id, worker_id=pump.worker_id, queues=command.queues, limit=command.limit)
                self._claimed(pump, command, jobs)
                return [(ev.ClaimReturned, {"jobs": tuple(jobs)})]
            case cmd.WriteOutcomes():
                applied = store.write_outcomes_many(lease_id=command.lease_id, outcomes=_records(command.outcomes))
                return [(ev.OutcomesWritten, {"applied": frozenset(applied)})]
            case cmd.OpenLease():
                lease_id = uuid.UUID(int=self.rng.getrandbits(128), version=4)
                store.open_lease(lease_id=lease_id, worker_id=pump.worker_id, group="sim", hostname=f"n{pump.node.index}", pid=1,
                                 duration=self.options.lease_duration)
                self.invariants.lease_owner[lease_id] = pump
                return [(ev.LeaseOpened, {"lease_id": lease_id})]
            case cmd.RenewLease():
                return [(ev.LeaseRenewed, {"held": store.renew_lease(lease_id=command.lease_id, duration=self.options.lease_duration)})]
            case cmd.ExpireLeases():
                return [(ev.LeasesExpired, {"released": store.expire_leases(limit=1000)})]
            case cmd.MintSchedules():
                if store.due_schedules(limit=100):
                    raise SimulationBug("the simulation defines no schedules, yet one is due")
                return [(ev.SchedulesMinted, {"minted": 0})]
            case cmd.PurgeJobs():
                return [(ev.JobsPurged, {"purged": store.purge_jobs(older_than=command.retention.job_states, limit=command.limit)})]
            case cmd.PurgePumps():
                return [(ev.PumpsPurged, {"purged": store.purge_pumps(older_than=command.older_than)})]
            case cmd.ReconcileLease():
                released = store.reconcile_lease(lease_id=command.lease_id, known=command.known)
                return [(ev.LeaseReconciled, {"released": frozenset(released)})]
            case cmd.ReleaseJobs():
                released = store.release_jobs_many(lease_id=command.lease_id, job_ids=command.job_ids)
                return [(ev.JobsReleased, {"released": frozenset(released)})]
            case cmd.ReleaseLease():
                store.release_lease(lease_id=command.lease_id)
                return [(ev.LeaseReleased, {})]
        raise SimulationBug(f"{pump.name}: the simulation cannot run {command!r}")

    def _claimed(self, pump: SimPump, claim: cmd.ClaimJobs, jobs: list[ClaimedJob]) -> None:
        for job in jobs:
            self.invariants.claimed_under[(job.id, job.attempt)] = claim.lease_id

    # ---- handlers -----------------------------------------------------------------------------

    def _start_job(self, pump: SimPump, job: ClaimedJob) -> None:
        lease = self.invariants.claimed_under[(job.id, job.attempt)]
        pump.running[job.id] = (job.attempt, lease)
        self.invariants.started(pump, job.id, lease, job.attempt)
        if job.task_path == CRASH_TASK:
            self.at(self.t + self.rng.expovariate(1 / 0.05), self._job_kills_its_node, pump, job, pump.node.incarnation)
            self.kick(pump)
            return
        if job.task_path != TASK:
            result, duration = "unroutable", 0.001
        else:
            result = "failed" if self.rng.random() < self.scenario.fail_rate else "succeeded"
            long = self.rng.random() < self.scenario.long_job_rate
            duration = self.options.lease_duration * self.rng.uniform(1.0, 2.0) if long else self.rng.expovariate(1 / 0.1)
        self.at(self.t + duration, self._job_done, pump, job, result, pump.node.incarnation)
        self.kick(pump)

    def _job_kills_its_node(self, pump: SimPump, job: ClaimedJob, incarnation: int) -> None:
        """The handler ends its process: every pump of the node dies with every job it ran. The
        process is restarted (a supervisor), during the quiesce too: this is the job, not a fault."""
        node = pump.node
        if not node.alive or node.incarnation != incarnation:
            return
        self.log.line(self.t, pump.name, f"job #{job.id} attempt {job.attempt} kills n{node.index}")
        self._crash(node)
        self.at(self.t + self.rng.uniform(0.2, 2.0), self._restart, node)

    def _job_done(self, pump: SimPump, job: ClaimedJob, result: str, incarnation: int) -> None:
        if not pump.node.alive or pump.node.incarnation != incarnation:
            return  # the process died with its workers
        if pump.running.get(job.id, (None,))[0] == job.attempt:
            del pump.running[job.id]
        self.invariants.finished(pump, job.id, job.attempt)
        self._post(pump, ev.JobFinished, job_id=job.id, attempt=job.attempt, result=result, jitter=self.rng.random())

    # ---- the producer and its hints -----------------------------------------------------------

    def _enqueue(self, spec) -> None:
        run_at = self._db_now() + timedelta(seconds=spec.delay) if spec.delay else None
        (job_id,) = InMemoryStore(self.database).enqueue_many([
            NewJob(task_path=spec.task_path, payload={"args": [], "kwargs": {}}, queue=spec.queue, priority=spec.priority, run_at=run_at,
                   max_attempts=spec.max_attempts, backoff_base=spec.backoff_base, backoff_max=spec.backoff_max)
        ])
        self.invariants.enqueued.add(job_id)
        self.log.line(self.t, "producer", f"enqueue #{job_id} {spec.queue} due+{spec.delay:.3f}")
        for pump in self.pumps:
            if not pump.alive or spec.queue not in self.options.policy.queues:
                continue
            if not self.quiescing and self.rng.random() < self.scenario.hint_loss:
                continue
            copies = 2 if not self.quiescing and self.rng.random() < self.scenario.hint_dup else 1
            for _ in range(copies):
                self.at(self.t + self._latency(), self._hint, pump)

    def _hint(self, pump: SimPump) -> None:
        # Pump.hint's pre-check, on the snapshot it publishes after each event: here, the driver
        # itself. Unlike Pump.hint, several hints may wait in the channel (duplicates are one of
        # the injected faults): the driver has to cope with any number of them.
        if pump.alive and pump.driver.free_slots:
            self._post(pump, ev.HintReceived)


_READ_ONLY = {
    ev.ClaimReturned: "jobs", ev.LeasesExpired: "released", ev.JobsPurged: "purged", ev.PumpsPurged: "purged", ev.SchedulesMinted: "minted",
}


def _changed(results: list) -> bool:
    """Whether the statement may have changed a row (an empty claim or maintenance run did not)."""
    return not (len(results) == 1 and results[0][0] in _READ_ONLY and not results[0][1][_READ_ONLY[results[0][0]]])


def _records(outcomes) -> list[OutcomeRecord]:
    return [OutcomeRecord(job_id=o.job_id, attempt=o.attempt, kind=o.kind, retry_delay=o.retry_delay) for o in outcomes]

"""The simulated world: nodes, pumps running the real Node Driver, in-memory databases.

Theory of operation
-------------------
A discrete-event simulation on virtual time. Every action (a pump's next step, a statement
reaching the database, its answer coming back, a handler finishing, a hint, a fault) is an entry
in one heap keyed by its virtual time; entries at the same instant are ordered by a draw of the
seed's random source, so that one source decides every interleaving, every latency, every
handler's duration and outcome, and every fault. Nothing reads the host clock.

Each simulated pump is a shell around a real ``NodeDriver`` that behaves as the production pump
does (``backwave/shell/pump.py``): one event at a time, its commands in order, one store call in
flight, handlers on a pool that posts ``JobFinished``. Its store commands run in the production
pump's own executor (``backwave/shell/executor.py``: the pipelined write then claim, the outcome
records, maintenance, the claims a failed write takes down), so what is simulated is the code
that ships. A store call is split in two: the executor runs the statement against the
InMemoryStore when the request reaches the database, and the answer reaches the driver a latency
later, so other pumps' statements, lapses and crashes fall in between. Faults are injected around
the executor: a statement lost on its way fails unrun, one whose answer is lost ran.

The node's clock (the driver's ``now``) is the virtual time plus a per-node offset that clock
jumps move forward; the database clock is the virtual time itself. A seed may draw several
databases (a backend on another database): every node runs its pumps on each of them, as a
worker serving every backend's database does, and a job lives on one.

Threads. Every action runs on a simulated thread: the pump's own (its steps and the answers of
its store calls), a worker thread of its pool (a handler ending), or the hint listener. With
``Config.thread_checks`` the driver of a pump answers only its own thread (``OwnedDriver``): the
shell's rule, since the pump thread changes the driver while any other thread would read it.
With ``Config.pool_threads`` each pump has exactly ``pool_size`` worker threads, and a handler
keeps its thread until it returns, even after its pump gave its attempt up.

The shell's side channel. Besides the driver, the simulated pump mirrors what the production
pump does around it, where the shell-level defects live: each attempt's report rides on its
JobFinished and Outcome into the write (``_job_done``); Django's task_finished is sent once the
write's answer has arrived, for each outcome the executor says the store applied (``_answer``,
``_send_task_finished``); the hint listener's pre-check (``_hint``); and the observer loop,
which delivers the transitions a statement noted right after it ran (``_deliver_transitions``). These mirror
backwave/shell/pump.py and execution.py; when those change, change them here the same way.

Job control (``Config.job_control``). The operator cancels jobs at drawn moments with the admin's
statement (``InMemoryStore.cancel_jobs``); the workers of a running one hear of it by a NOTIFY
that may be lost (``_cancel_heard``; the heartbeat reads it too). A StopAttempt (a time limit
passed, a cancel) reaches its handler, which obeys (returns soon) or runs on; with a hard limit,
one still running that much later makes its process drain and end itself (``_hard_limit``, as
backwave/shell/worker.py's _enforce_hard_limit), and the node restarts. Its draws, ties of what
it schedules included, come from a stream of their own (``control_rng``).
"""

from __future__ import annotations

import heapq
import json
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import InvalidEvent, NodeDriver, State
from backwave.core.jobs import ClaimedJob
from backwave.shell.executor import Executor, lease_ids_from
from backwave.store.contract import NOTHING_OBSERVED, After, DeliveryResult, DependencyRefused, NewJob, StoreError
from backwave.testing.memory_store import InMemoryStore, MemoryDatabase, QueueAdmission

from .faults import Faults
from .handlers import Report, run_handler
from .invariants import Invariants, SimulationBug
from .logbook import Logbook, fmt_command, fmt_event
from .scenario import CRASH_TASK, RUNNING_JOB, TASK, Config, Scenario

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)

# What the simulated observer watches: every transition a worker applies.
OBSERVE_EVERYTHING = json.dumps(
    [{"kind": kind, "task_path": None, "queue": None} for kind in ("succeeded", "failed", "retried", "quarantined", "lapsed")]
)

# With Config.job_control: two named observers, each watching every transition (cancels too),
# each delivered by a loop of its own, so that a transition waits for both.
OBSERVERS = ("audit", "metrics")
OBSERVE_BY_NAME = json.dumps(
    [
        {"kind": kind, "task_path": None, "queue": None, "observer": observer}
        for kind in ("succeeded", "failed", "retried", "quarantined", "lapsed", "cancelled")
        for observer in OBSERVERS
    ]
)
CANCELLED_BY = "sim:operator"
# The states an operator's cancel acts on (the admin's: all but the finished ones).
CANCELLABLE = ("ready", "waiting", "held", "running")

# Job ids of database k start past k * JOB_ID_STRIDE, so that an id names one job in the whole run.
JOB_ID_STRIDE = 1_000_000


class Node:
    """A worker process: its pumps share its clock and die with it."""

    __slots__ = ("index", "incarnation", "offset", "alive", "pumps", "ending")

    def __init__(self, index: int):
        self.index = index
        self.incarnation = 0
        self.offset = 0.0
        self.alive = True
        self.pumps: dict[tuple[int, int], SimPump] = {}  # (database, pump slot) -> the pump running in it
        self.ending = False  # a handler ran past the hard time limit: the process drains and ends itself


class SimPump:
    """One pump of a node: the driver, its event channel, its pending commands."""

    __slots__ = (
        "name",
        "node",
        "driver",
        "worker_id",
        "channel",
        "pending",
        "busy",
        "paused_until",
        "step_scheduled",
        "wake_at",
        "stopped",
        "handlers",
        "store",
        "begun",
        "database",
        "cut_off_until",
        "published_free_slots",
        "executor",
        "landed",
        "ends",
    )

    def __init__(self, name: str, node: Node, driver: NodeDriver | OwnedDriver, store: InMemoryStore, database: int):
        self.name = name
        self.node = node
        self.driver = driver
        self.worker_id = name
        self.store = store
        self.database = database  # index into World.databases
        self.channel: deque[ev.Event] = deque()
        self.pending: deque[cmd.Command] = deque()
        self.busy = False  # a store call is in flight
        self.paused_until = 0.0
        self.step_scheduled = False
        self.wake_at: float | None = None
        self.stopped = False
        self.begun = False  # Started is handled first, before anything in the channel
        # (job id, attempt, lease) of each handler running on the pool: one per busy worker thread,
        # including the handlers of attempts the driver gave up with a lost lease.
        self.handlers: list[tuple[int, int, uuid.UUID]] = []
        self.cut_off_until = 0.0  # a network partition between this pump and its database
        # What the pump thread publishes after each event for other threads (Pump's snapshot).
        self.published_free_slots = 0
        self.executor: Executor | None = None  # set by the world, which owns its clock and random source
        self.landed: list = []  # outcomes the statement running now applied, told of once its answer arrives
        # (job id, attempt) -> the number of its handler's scheduled end: a handler that obeys a
        # StopAttempt ends sooner, and the end scheduled first is then void.
        self.ends: dict[tuple[int, int], int] = {}

    @property
    def alive(self) -> bool:
        return self.node.alive and not self.stopped


class OwnedDriver:
    """A pump's driver that answers only the pump's own thread (see "Threads" above): any other
    simulated thread reading it is a bug, whatever it reads, because the pump thread may be
    changing it at that very moment (``free_slots`` iterates the deque of claims in flight)."""

    __slots__ = ("_driver", "_world", "_pump")

    def __init__(self, driver: NodeDriver, world: World, pump: str):
        self._driver = driver
        self._world = world
        self._pump = pump

    def __getattr__(self, name: str):
        thread = self._world.thread
        if thread is not None:
            raise SimulationBug(
                f"the {thread} read driver.{name} of {self._pump}: only the pump's own thread may touch its driver, "
                "which that thread changes meanwhile"
            )
        return getattr(self._driver, name)


# The share of handlers that end with backwave.Snooze instead of succeeding.
SNOOZE_RATE = 0.02


class World(Faults):
    """One seed's run. ``run()`` returns normally or raises SimulationBug."""

    def __init__(self, scenario: Scenario, config: Config, rng: random.Random, logbook: Logbook):
        self.scenario = scenario
        self.config = config
        self.rng = rng
        # Snoozes draw from a stream of their own, seeded once from the scenario: every draw of
        # ``rng`` stays where it was, so a recorded seed replays the interleaving it always did.
        self.snooze_rng = random.Random(f"snooze:{scenario!r}")
        # Job control draws from its own stream too, ties of what it schedules included: a seed
        # that draws no time limit, cancel or unique task replays the run it replayed before.
        self.control_rng = random.Random(f"job-control:{scenario!r}")
        self.log = logbook
        self.t = 0.0
        self.options = scenario.options
        self.databases = [MemoryDatabase(now=self._db_now, last_id=k * JOB_ID_STRIDE) for k in range(scenario.databases)]
        self.invariants = Invariants(self)
        self.spec_jobs: dict[int, int] = {}  # JobSpec index -> the job enqueued for it
        self.nodes = [Node(i) for i in range(scenario.nodes)]
        self.pumps: list[SimPump] = []
        self.quiescing = False
        self.outage_until = [0.0] * scenario.databases  # per database
        self.thread: str | None = None  # the simulated thread of the action running now; None: a pump's own
        self.steps = 0
        self._heap: list = []
        self._seq = 0
        self._observer_stores: dict[int, InMemoryStore] = {}
        self._deliveries = 0

    @property
    def admitted_queues(self) -> frozenset[str]:
        """The queues under a per-key or rate limit: every pump knows them, as every worker does."""
        return (
            frozenset(self.scenario.key_limits) | frozenset(self.scenario.rate_limits) | frozenset(self.scenario.key_rate_limits)
        )

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        for database in self.databases:
            for queue, limit in self.scenario.concurrency_limits.items():
                database.queues[queue] = (limit, False)
            for queue in self.admitted_queues:
                rate_limit, period = self.scenario.rate_limits.get(queue, (None, None))
                key_rate = self.scenario.key_rate_limits.get(queue)
                database.admission[queue] = QueueAdmission(
                    self.scenario.key_limits.get(queue), rate_limit, period or (1.0 if key_rate else None), key_rate
                )
        for node in self.nodes:
            self._boot(node)
        for index, spec in enumerate(self.scenario.jobs):
            self.at(spec.at, self._enqueue, spec, index)
        for when, index in self.scenario.cancels:
            self.at_control(when, self._cancel, index)
        if self.config.faults:
            self.at(self.rng.expovariate(1 / self.scenario.fault_every), self._fault)
        self.at(self.scenario.fault_phase, self._quiesce)
        deadline = self.scenario.fault_phase + self.config.quiesce_limit
        finished_at: float | None = None
        while self._heap:
            when, _, _, action, args = heapq.heappop(self._heap)
            if finished_at is None and when > deadline:
                self.invariants.stuck(deadline)
            if finished_at is not None and when > finished_at + self.rest_limit:
                self.invariants.restless(finished_at + self.rest_limit)
            self.t = when
            action(*args)
            self.steps += 1
            if not self.quiescing:
                continue
            if finished_at is None and self.invariants.all_finished():
                finished_at = self.t
                self.log.line(self.t, "world", f"all {len(self.invariants.enqueued)} jobs finished after {self.steps} steps")
                if not self.config.report_checks:
                    self.invariants.over()
                    return
            if finished_at is not None and all(self.at_rest(pump) for pump in self.pumps):
                # Nothing runs, nothing is held: what a pump still keeps now, it keeps for ever.
                self.log.line(self.t, "world", f"every pump at rest after {self.steps} steps")
                self.invariants.at_rest()
                self.invariants.over()
                return
        self.invariants.stuck(self.t)

    @property
    def rest_limit(self) -> float:
        """Virtual seconds the pumps may take to come to rest once every job has finished: the
        longest a handler of an attempt already given up may hang on, and then some."""
        return 6 * self.options.lease_duration + 10.0

    def at_rest(self, pump: SimPump) -> bool:
        """A live pump that runs no handler, holds no job (none executing, no outcome buffered or
        being written) and has no handler's end still to hear of. Its polls, heartbeats and
        maintenance go on, and find nothing to do: every job has finished."""
        if not pump.alive:
            return True
        return not (pump.handlers or pump.driver.unreported or any(isinstance(event, ev.JobFinished) for event in pump.channel))

    def at(self, when: float, action: Callable, *args) -> None:
        """Schedule ``action(*args)`` at virtual time ``when`` (ties ordered by a random draw)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.t), self.rng.random(), self._seq, action, args))

    def at_control(self, when: float, action: Callable, *args) -> None:
        """``at``, its tie drawn from the job-control stream (see ``control_rng``)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.t), self.control_rng.random(), self._seq, action, args))

    def _db_now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t)

    def node_now(self, node: Node) -> float:
        return self.t + node.offset

    @contextmanager
    def on_thread(self, thread: str) -> Iterator[None]:
        """Run the body as another simulated thread than the pumps' own (see "Threads")."""
        self.thread = thread
        try:
            yield
        finally:
            self.thread = None

    # ---- nodes and pumps ----------------------------------------------------------------------

    def _boot(self, node: Node) -> None:
        node.alive = True
        node.ending = False
        node.incarnation += 1
        node.pumps = {}
        for database in range(len(self.databases)):
            for index in range(self.scenario.pumps_per_node):
                self._start_pump(node, database, index)

    def _start_pump(self, node: Node, database: int, index: int) -> None:
        on = f"d{database}" if database else ""
        name = f"n{node.index}.{node.incarnation}{on}p{index}.{len(self.pumps)}"
        driver = NodeDriver(self.options)
        owned = OwnedDriver(driver, self, name) if self.config.thread_checks else driver
        pump = SimPump(name, node, owned, InMemoryStore(self.databases[database], admitted_queues=self.admitted_queues), database)
        pump.executor = Executor(
            pump.store,
            options=self.options,
            worker_id=pump.worker_id,
            hostname=f"n{node.index}",
            pid=1,
            clock=lambda: self.node_now(node),
            jitter=self.rng.random,
            time_zone=lambda: UTC,
            new_lease_id=lease_ids_from(self.rng),
            on_applied=lambda outcome, written: pump.landed.append(outcome) if outcome.report is not None else None,
        )
        if self.config.observers:  # every outcome and lapse (and cancel) is noted for observers
            pump.store.observed = OBSERVE_BY_NAME if self.config.job_control else OBSERVE_EVERYTHING
        node.pumps[(database, index)] = pump
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
        pump.published_free_slots = pump.driver.free_slots
        self.invariants.check_driver(pump)
        if pump.driver.state is State.STOPPED and not pump.stopped:
            pump.stopped = True
            self.log.line(self.t, pump.name, "stopped")
            if pump.node.ending:  # past a hard time limit: the process ends once its pumps stopped
                if pump.node.alive and all(not other.alive for other in pump.node.pumps.values()):
                    self.at_control(self.t, self._end_process, pump.node, pump.node.incarnation)
            elif pump.node.alive:  # the process starts a new pump in its place (a rolling restart)
                self.at(self.t + self.rng.uniform(0.1, 2.0), self._replace, pump)

    def _replace(self, stopped: SimPump) -> None:
        node = stopped.node
        for (database, index), pump in node.pumps.items():
            if pump is stopped and node.alive:
                self._start_pump(node, database, index)
                return

    # ---- commands -----------------------------------------------------------------------------

    def _run(self, pump: SimPump) -> None:
        command = pump.pending.popleft()
        if isinstance(command, cmd.ExecuteJob):
            self._start_job(pump, command.job)
            return
        if isinstance(command, cmd.StopAttempt):
            if self.config.job_control:
                self._told_to_stop(pump, command)
            # Otherwise simulated handlers do not look at their context: they run to their end.
            return
        batch = pump.executor.take(command, pump.pending)  # a write and the claim after it go as one
        pump.busy = True
        self.at(self.t + self._latency(), self._statement, pump, batch, pump.node.incarnation)

    def _latency(self) -> float:
        return self.rng.expovariate(1 / 0.002) if self.rng.random() < 0.95 else self.rng.uniform(0.05, 0.5)

    def _statement(self, pump: SimPump, batch: tuple[cmd.Command, ...], incarnation: int) -> None:
        """The request reached the database: the executor runs it (it runs even if its node has
        died since); the answer reaches the pump a latency later, in ``_answer``."""
        fault = self._fault_for_statement(pump)
        if fault == "before":
            results = pump.executor.failed(batch, pump.pending)
        else:
            try:
                results = pump.executor.run(batch)
            except (StoreError, ValueError, TypeError) as error:  # a pump halts on any of these
                raise SimulationBug(
                    f"{pump.name}: {' + '.join(type(c).__name__ for c in batch)} raised {type(error).__name__}: {error}"
                ) from error
            self._observe(pump, batch, results)
            if _changed(results):
                self.invariants.check_store()
                if self.config.observers:
                    self._deliver_transitions(pump.database)
            if fault == "after":  # committed, but the answer is lost: the pump hears of no write
                pump.landed.clear()
                results = pump.executor.failed(batch, pump.pending)
        landed, pump.landed = pump.landed, []
        self.log.line(self.t, pump.name, f"db {'+'.join(type(c).__name__ for c in batch)}{' FAULT-' + fault if fault else ''}")
        self.at(self.t + self._latency(), self._answer, pump, results, landed, batch[0], incarnation)

    def _answer(self, pump: SimPump, results: list[ev.Event], landed: list, first: cmd.Command, incarnation: int) -> None:
        if not pump.node.alive or pump.node.incarnation != incarnation or pump.stopped:
            return
        if self.t < pump.paused_until:
            self.at(pump.paused_until, self._answer, pump, results, landed, first, incarnation)
            return
        pump.busy = False
        for outcome in landed:  # the executor's on_applied, heard on the pump's thread once the write landed
            self._send_task_finished(pump, outcome, first.lease_id)
        now = self.node_now(pump.node)
        for event in results:
            self.handle(pump, replace(event, now=now))  # stamped when the answer arrives
            if pump.stopped:
                return
        self.kick(pump)

    def _observe(self, pump: SimPump, batch: tuple[cmd.Command, ...], results: list[ev.Event]) -> None:
        """What the invariants learn from a statement that ran: claims, writes, leases."""
        for command, event in zip(batch, results, strict=True):
            match event:
                case ev.ClaimReturned():
                    for job in event.jobs:
                        self.invariants.claimed_under[(job.id, job.attempt)] = command.lease_id
                case ev.OutcomesWritten():
                    for outcome in command.outcomes:
                        self.invariants.written(
                            outcome.job_id, outcome.attempt, command.lease_id, outcome.job_id in event.applied
                        )
                case ev.LeaseOpened():
                    self.invariants.lease_owner[event.lease_id] = pump
                case ev.SchedulesMinted() if event.minted:
                    raise SimulationBug("the simulation defines no schedules, yet one was minted")

    def _deliver_transitions(self, database: int) -> None:
        """The observer loop, run the moment a statement noted transitions: claim what is due on
        that database and hand each to the observer the invariants keep. Inline, with no draw of
        the random source and nothing scheduled, so enabling it changes no interleaving."""
        if not self.databases[database].transitions:
            return
        store = self._observer_stores.get(database) or self._observer_stores.setdefault(
            database, InMemoryStore(self.databases[database])
        )
        for observer in OBSERVERS if self.config.job_control else (None,):
            observers = (observer,) if observer is not None else ()
            while True:
                self._deliveries += 1
                token = uuid.UUID(int=self._deliveries)
                records = store.claim_transitions(
                    token=token, limit=1000, lease=self.options.lease_duration, observers=observers, deliverer=observer
                )
                if not records:
                    break
                for record in records:
                    self.invariants.transition_delivered(self.databases[database], record, observer)
                store.settle_transitions(
                    token=token, results=[DeliveryResult(id=record.id, delivered=observers) for record in records]
                )

    # ---- handlers -----------------------------------------------------------------------------

    def _start_job(self, pump: SimPump, job: ClaimedJob) -> None:
        lease = self.invariants.claimed_under[(job.id, job.attempt)]
        if self.config.pool_threads and len(pump.handlers) >= self.options.pool_size:
            given_up = sum(
                1
                for job_id, attempt, _ in pump.handlers
                if job_id not in pump.driver._executing or pump.driver._executing[job_id].attempt != attempt
            )
            raise SimulationBug(
                f"{pump.name} claimed job {job.id} (attempt {job.attempt}) but all {self.options.pool_size} of its worker threads still run "
                f"handlers, {given_up} of them of attempts it gave up with its lease: the job waits unstarted while its lease runs"
            )
        pump.handlers.append((job.id, job.attempt, lease))
        self.invariants.started(
            pump, job.id, lease, job.attempt, (job.queue, self.databases[pump.database].jobs[job.id].limit_key)
        )
        if job.task_path != TASK:
            result, duration = "unroutable", 0.001
        else:
            result = "failed" if self.rng.random() < self.scenario.fail_rate else "succeeded"
            long = self.rng.random() < self.scenario.long_job_rate
            duration = self.options.lease_duration * self.rng.uniform(1.0, 2.0) if long else self.rng.expovariate(1 / 0.1)
        if job.task_path == CRASH_TASK:
            result, duration = "crash", self.rng.expovariate(1 / 0.1)
        if self.config.lease_losses and not self.quiescing and self.rng.random() < self.scenario.hang_rate:
            # Hung for a few leases; it does return. Only in the fault phase: a hung handler holds
            # its queue's concurrency slot, and hangs without end would outlast any quiesce.
            duration = self.options.lease_duration * self.rng.uniform(2.0, 5.0)
        if self.config.job_control and job.timeout is not None and job.task_path == TASK and self.control_rng.random() < 0.5:
            duration = max(duration, job.timeout * self.control_rng.uniform(1.2, 3.0))  # it outlives its time limit
        report = run_handler(
            self.rng,
            job_id=job.id,
            attempt=job.attempt,
            task_path=job.task_path,
            result=result,
            duration=duration,
            hostile_rate=self.scenario.hostile_rate if self.config.hostile_values else None,
        )
        pump.ends[(job.id, job.attempt)] = 0
        self.at(self.t + duration, self._job_done, pump, job, report, lease, pump.node.incarnation)
        self.kick(pump)

    def _job_done(self, pump: SimPump, job: ClaimedJob, report: Report, lease: uuid.UUID, incarnation: int, end: int = 0) -> None:
        if not pump.node.alive or pump.node.incarnation != incarnation:
            return  # the process died with its workers
        if pump.ends.get((job.id, job.attempt)) != end:
            return  # it obeyed a StopAttempt and ended sooner
        del pump.ends[(job.id, job.attempt)]
        pump.handlers.remove((job.id, job.attempt, lease))
        self.invariants.finished(pump, job.id, job.attempt)
        if report.result == "crash":
            self._exit_process(pump, job)
            return
        result, delay = report.result, None
        snooze_rate = SNOOZE_RATE if self.scenario.snooze_rate is None else self.scenario.snooze_rate
        if result == "succeeded" and self.snooze_rng.random() < snooze_rate:
            # backwave.Snooze: ready again after the delay, the attempt left out of max_attempts
            # (the invariants' attempt count holds it to that).
            result, delay = "snoozed", self.snooze_rng.uniform(0.0, 0.5)
        with self.on_thread(f"worker thread of {pump.name}"):
            # Pump._finished: the report rides on the JobFinished, and on the outcome after it.
            self._post(
                pump,
                ev.JobFinished,
                job_id=job.id,
                attempt=job.attempt,
                result=result,
                jitter=self.rng.random(),
                delay=delay,
                report=report,
            )

    def _send_task_finished(self, pump: SimPump, outcome, lease: uuid.UUID) -> None:
        """Django's task_finished, where backwave/shell/execution.send_finished sends it: on the
        pump's thread once the write landed, for an outcome the store applied; never for a job
        that did not reach its task (unroutable)."""
        if outcome.report.result != "unroutable":
            self.invariants.notified(pump, outcome.job_id, outcome.attempt, lease, outcome.report.result)

    def _exit_process(self, pump: SimPump, job: ClaimedJob) -> None:
        """The handler ends its process (os._exit, a segfault, the OOM killer): every pump of the
        node dies with every job it ran. The process is restarted (a supervisor), during the
        quiesce too: this is the job, not a fault."""
        node = pump.node
        self.log.line(self.t, pump.name, f"job #{job.id} attempt {job.attempt} kills n{node.index}")
        self.invariants.process_killed_by(job.id, node)
        self._crash(node)
        self.at(self.t + self.rng.uniform(0.2, 2.0), self._restart, node)

    # ---- job control: stops, hard limits, cancels ---------------------------------------------

    def _told_to_stop(self, pump: SimPump, command: cmd.StopAttempt) -> None:
        """The handler's context says stop (its time limit passed, or it was cancelled): some
        handlers obey at once, the rest run on. Past the hard limit, the process ends itself."""
        key = (command.job_id, command.attempt)
        if key not in pump.ends:
            return  # it returned meanwhile
        running = next((h for h in pump.handlers if h[:2] == key), None)
        if running is None:
            return
        executing = pump.driver._executing.get(command.job_id)
        if executing is None or executing.attempt != command.attempt:
            # Ended past its deadline (its outcome buffered): the handler outlives its attempt.
            self.invariants.outlived(pump, *key)
        if self.control_rng.random() < self.scenario.obey_rate:
            pump.ends[key] += 1
            job = self.databases[pump.database].jobs[command.job_id]
            claimed = ClaimedJob(
                id=job.id,
                task_path=job.task_path,
                queue=job.queue,
                priority=0,
                payload={},
                attempt=command.attempt,
                max_attempts=job.max_attempts,
                backoff_base=0,
                backoff_max=0,
            )
            cancelled = command.reason.startswith("cancelled")
            report = Report(job_id=job.id, attempt=command.attempt, result="cancelled" if cancelled else "failed")
            if job.task_path == CRASH_TASK:
                report = Report(job_id=job.id, attempt=command.attempt, result="crash")
            self.log.line(self.t, pump.name, f"job #{job.id} attempt {command.attempt} stops ({command.reason})")
            delay = self.control_rng.expovariate(1 / 0.05)
            self.at_control(
                self.t + delay, self._job_done, pump, claimed, report, running[2], pump.node.incarnation, pump.ends[key]
            )
        elif self.scenario.hard_time_limit is not None:
            self.at_control(
                self.t + self.scenario.hard_time_limit, self._hard_limit, pump, key, pump.node.incarnation, pump.ends[key]
            )

    def _hard_limit(self, pump: SimPump, key: tuple[int, int], incarnation: int, end: int) -> None:
        """Worker._enforce_hard_limit: the handler still runs, so its process drains and ends."""
        node = pump.node
        if not node.alive or node.incarnation != incarnation or node.ending or pump.ends.get(key) != end:
            return
        node.ending = True
        self.log.line(
            self.t, pump.name, f"job #{key[0]} attempt {key[1]} past the hard time limit: n{node.index} drains and ends"
        )
        live = [other for other in node.pumps.values() if other.alive]
        for other in live:
            self._post(other, ev.DrainRequested, timeout=self.options.drain_timeout)
        if not live:
            self.at_control(self.t, self._end_process, node, incarnation)
        # A drain that cannot finish (a pump cut off from its database) does not keep the
        # process: it ends anyway, its leases lapsing as a crash's do.
        self.at_control(
            self.t + self.options.drain_timeout + 2 * self.options.lease_duration, self._end_process, node, incarnation
        )

    def _end_process(self, node: Node, incarnation: int) -> None:
        if node.alive and node.incarnation == incarnation:
            self.log.line(self.t, f"n{node.index}", "ends itself (hard time limit)")
            self._crash(node)
            self.at_control(self.t + self.control_rng.uniform(0.2, 1.0), self._restart, node)

    def _cancel(self, index: int) -> None:
        """The operator cancels the job of JobSpec ``index`` (or one running: RUNNING_JOB) with one
        statement; the workers of a running job hear of it by a NOTIFY (which may be lost:
        their heartbeat reads it too)."""
        if index == RUNNING_JOB:
            running = sorted(
                (job.id, database)
                for database, db in enumerate(self.databases)
                for job in db.jobs.values()
                if job.state == "running"
            )
            if not running:
                return
            job_id, database = self.control_rng.choice(running)
        else:
            job_id = self.spec_jobs.get(index)
            if job_id is None:
                return  # not enqueued yet, or refused
            database = self.scenario.jobs[index].database
        db = self.databases[database]
        attempts = db.jobs[job_id].attempts if job_id in db.jobs else 0
        observed = (
            (OBSERVE_BY_NAME if self.config.job_control else OBSERVE_EVERYTHING) if self.config.observers else NOTHING_OBSERVED
        )
        rows = InMemoryStore(db).cancel_jobs(job_ids=[job_id], by=CANCELLED_BY, allowed=CANCELLABLE, observed=observed)
        for cancelled, state, changed in rows:
            self.log.line(self.t, "operator", f"cancel #{cancelled} ({state}){'' if changed else ': nothing to do'}")
            if not changed:
                continue
            self.invariants.cancel_applied(cancelled, attempts)
            if state == "running":
                for pump in self.pumps:
                    if pump.alive and pump.database == database:
                        if not self.quiescing and self.control_rng.random() < self.scenario.hint_loss:
                            continue
                        self.at_control(self.t + self.control_rng.expovariate(1 / 0.002), self._cancel_heard, pump, cancelled)
        self.invariants.check_store()
        if self.config.observers:
            self._deliver_transitions(database)

    def _cancel_heard(self, pump: SimPump, job_id: int) -> None:
        """Pump.cancel_requested, on the hint listener's thread: posted whether or not it runs here."""
        if pump.alive:
            with self.on_thread(f"hint listener thread of n{pump.node.index}"):
                self._post(pump, ev.CancelRequested, job_id=job_id, by=CANCELLED_BY)

    # ---- the producer and its hints -----------------------------------------------------------

    def _enqueue(self, spec, index: int) -> None:
        run_at = self._db_now() + timedelta(seconds=spec.delay) if spec.delay else None
        database = self.databases[spec.database]
        # One edge per ancestor, as backwave/tasking/workflow.py makes them: two earlier specs
        # may name one job (a unique enqueue that found the job holding its key).
        edges: dict[int, str] = {}
        for index, on_failure in spec.after:
            if index in self.spec_jobs:
                edges.setdefault(self.spec_jobs[index], on_failure)
        after = tuple(After(job_id=job_id, on_failure=on_failure) for job_id, on_failure in edges.items())
        try:
            (job_id,) = InMemoryStore(database).enqueue_many(
                [
                    NewJob(
                        task_path=spec.task_path,
                        payload={"args": [], "kwargs": {}},
                        queue=spec.queue,
                        priority=spec.priority,
                        run_at=run_at,
                        max_attempts=spec.max_attempts,
                        backoff_base=spec.backoff_base,
                        backoff_max=spec.backoff_max,
                        after=after,
                        limit_key=spec.limit_key,
                        timeout=spec.timeout,
                        unique_key=spec.unique_key,
                        unique_period=spec.unique_period,
                        unique_states=spec.unique_states,
                    )
                ]
            )
        except DependencyRefused as refused:
            # An ancestor already failed (or was purged): what the producer's enqueue is told.
            self.log.line(self.t, "producer", f"enqueue refused: {refused}")
            return
        self.spec_jobs[index] = job_id
        if spec.unique_key is not None:
            duplicate = job_id in self.invariants.enqueued
            self.invariants.unique_enqueued(database, spec, job_id, duplicate)
            if duplicate:
                self.log.line(self.t, "producer", f"enqueue of {spec.unique_key} found #{job_id}")
                return
        self.invariants.enqueued[job_id] = database
        if spec.task_path == CRASH_TASK:
            self.invariants.crashers.add(job_id)
        self.log.line(self.t, "producer", f"enqueue #{job_id} {spec.queue} due+{spec.delay:.3f}")
        for pump in self.pumps:  # the hint comes from the job's own database
            if not pump.alive or spec.queue not in self.options.policy.queues or pump.database != spec.database:
                continue
            if not self.quiescing and self.rng.random() < self.scenario.hint_loss:
                continue
            copies = 2 if not self.quiescing and self.rng.random() < self.scenario.hint_dup else 1
            for _ in range(copies):
                self.at(self.t + self._latency(), self._hint, pump)

    def _hint(self, pump: SimPump) -> None:
        """Pump.hint, on the hint listener's thread, with its pre-check on the snapshot the pump
        publishes after each event (never the driver itself). Unlike Pump.hint, several hints may
        wait in the channel (duplicates are one of the injected faults): the driver copes with any
        number of them."""
        if not pump.alive:
            return
        with self.on_thread(f"hint listener thread of n{pump.node.index}"):
            if pump.published_free_slots:
                self._post(pump, ev.HintReceived)


_READ_ONLY = {
    ev.ClaimReturned: "jobs",
    ev.LeasesExpired: "released",
    ev.JobsPurged: "purged",
    ev.PumpsPurged: "purged",
    ev.TaskStatsPurged: "purged",
    ev.SchedulesMinted: "minted",
    ev.TablesAnalyzed: "tables",
}


def _changed(results: list[ev.Event]) -> bool:
    """Whether the statement may have changed a row (an empty claim or maintenance run did not)."""
    if len(results) != 1 or type(results[0]) not in _READ_ONLY:
        return True
    return bool(getattr(results[0], _READ_ONLY[type(results[0])]))

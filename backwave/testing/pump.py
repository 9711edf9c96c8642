"""The deterministic test pump: the real Node Driver, handlers run inline, a virtual clock.

Theory of operation
-------------------
Like the production pump (``backwave/shell/pump.py``), it feeds events to a ``NodeDriver`` and runs
the commands that come back through the same executor (``backwave/shell/executor.py``), each
result becoming the next event. So with the same options it makes the same scheduling decisions
and the same store calls. What differs is the shell around it:

* One thread, the test's. An ``ExecuteJob`` runs the handler at once, inline, through the same
  ``run_attempt`` as a worker; its ``JobFinished`` joins the event queue behind the commands still
  pending, where a worker thread's would arrive.
* The store is a ``DjangoConnectionStore`` on the test's own connection, so the pump sees the
  rows the test wrote inside its transaction. Each attempt runs in a savepoint when the test runs
  inside a transaction: a handler that breaks the transaction (an IntegrityError it caught) is
  rolled back alone, and the test's transaction stays usable.
* Time is a ``VirtualClock``. Nothing happens between calls: ``drain()`` delivers what is due
  now (and wakes the driver with a Wake-Up Hint, as an enqueue's NOTIFY would); ``advance()``
  only moves the clock (inside a task: the handler took that long, so its time limit can pass). After a long advance the driver may find its lease presumed lapsed and
  open a new one, exactly as a pump that slept that long would; nothing is held between calls,
  so nothing is lost by it.
* Store errors are raised in the test (a worker would retry a transient one on a later tick).

As in a worker, an attempt's report rides on its outcome through the driver (no map of reports
is kept), and Django's ``task_finished`` is sent once per outcome the store applied, after the
write, with the status that was stored; ``task_started`` is sent as the attempt starts.
"""

from __future__ import annotations

import importlib
import random
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.tasks import Task
from django.utils import timezone

from backwave import conf
from backwave.core import events as ev
from backwave.core.driver import NodeDriver, State
from backwave.core.jobs import OutcomeKind
from backwave.core.options import Retention, WorkerGroupOptions, validate_groups
from backwave.core.policy import Strict
from backwave.observers import Observer, ObserverRegistry
from backwave.shell.execution import (
    AttemptControls,
    AttemptReport,
    Commit,
    is_async,
    is_atomic,
    run_attempt,
    run_attempt_async,
    send_finished,
)
from backwave.shell.executor import Executor, lease_ids_from
from backwave.shell.observers import deliver
from backwave.tasking.registry import TaskRegistry

from .clock import VirtualClock
from .store import DjangoConnectionStore

# A test's pump keeps its lease for an hour of virtual time: real time also moves the database
# clock a little while a test runs (or sits in a debugger), and should never make it lapse.
TEST_LEASE_DURATION = 3600.0
DEFAULT_LIMIT = 10_000


class PumpStuck(RuntimeError):
    """drain() could not finish: the driver cannot make progress without time passing, or the
    attempts run past ``limit`` (a task that enqueues itself for ever?)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainResult:
    """What one ``drain()`` ran: outcome counts (as applied by the store) and every attempt."""

    succeeded: int = 0
    retried: int = 0  # failed attempts whose job will run again after its backoff
    failed: int = 0  # failed attempts with no attempts left: the job is dead
    quarantined: int = 0  # unroutable: unknown task or a payload that does not decode
    snoozed: int = 0  # backwave.Snooze: the job runs again after its delay, the attempt not counted
    cancelled: int = 0  # cancelled while it ran (backwave.cancel, the admin)
    attempts: tuple[AttemptReport, ...] = ()
    delivered: int = 0  # transitions whose observers all ran (see backwave.observers)
    undelivered: int = 0  # delivery tries that failed (an observer raised): retried after their backoff

    @property
    def errors(self) -> list[tuple[int, str, str]]:
        """(job id, exception class, traceback) of every attempt that did not succeed."""
        return [(a.job_id, a.error_class, a.traceback) for a in self.attempts if a.result != "succeeded"]


_KIND_FIELD = {
    OutcomeKind.SUCCEEDED: "succeeded",
    OutcomeKind.RETRY: "retried",
    OutcomeKind.FAILED: "failed",
    OutcomeKind.QUARANTINED: "quarantined",
    OutcomeKind.SNOOZED: "snoozed",
    OutcomeKind.CANCELLED: "cancelled",
}


class DeterministicPump:
    """Runs your tasks in the test's thread, on the test's database connection, on virtual time.

    ``tasks``: the tasks it may run, as Task objects, modules or module paths; by default every
    task the worker would find (each app's ``tasks`` module and ``BACKWAVE["TASK_MODULES"]``).
    ``queues``: by default every queue of the BackWave backends (in the order of their QUEUES)
    and of those tasks, claimed as Strict claims them: queue order first, then priority. ``group``:
    take the options of that ``BACKWAVE["WORKER_GROUPS"]`` entry; ``options``: a whole
    WorkerGroupOptions; other keywords override single options (``pool_size=4``).
    """

    def __init__(
        self,
        *,
        tasks: Iterable[Task | ModuleType | str] | None = None,
        queues: Iterable[str] | None = None,
        group: str | None = None,
        options: WorkerGroupOptions | None = None,
        database: str = "default",
        worker_id: str = "backwave-test:0",
        seed: int = 0,
        observers: Iterable[Observer | ModuleType | str] | None = None,
        **overrides: Any,
    ) -> None:
        self.registry = _registry(tasks)
        self.observers = _observers(observers)
        self.options = _options(
            self.registry, queues=queues, group=group, options=options, overrides=overrides, database=database
        )
        self.clock = VirtualClock()
        # The queues under a per-key or rate limit, claimed as a worker claims them.
        self.store = DjangoConnectionStore(database, clock=self.clock, admitted_queues=conf.admitted_queue_names())
        self.store.observed = self.observers.observed
        self.delivery_options = conf.delivery_options()
        self.driver = NodeDriver(self.options)
        self.worker_id = worker_id
        self.attempts: list[AttemptReport] = []  # every attempt this pump ran, in order
        self._database = database
        self._random = random.Random(seed)  # backoff jitter and lease ids: the same run every time
        self._channel: deque[ev.Event] = deque()
        self._scope = _InlineScope(database)
        self._counts: dict[str, int] = {}
        self._busy = False
        self._first = self._stop_after = 0
        self.controls = AttemptControls()  # the running attempt's, as a pump's (see _run_channel)
        # Store errors are not caught (no on_fault): the test sees them.
        self._executor = Executor(
            self.store,
            options=self.options,
            worker_id=worker_id,
            hostname="test",
            pid=0,
            clock=self.clock.monotonic,
            jitter=self._random.random,
            time_zone=timezone.get_default_timezone,
            new_lease_id=lease_ids_from(self._random),
            on_applied=self._applied,
            progress=self.controls.reports,
            stop_attempt=lambda command: self.controls.stop(command.job_id, command.attempt, command.reason),
        )

    # ---- the public API ---------------------------------------------------------------------

    def drain(self, *, limit: int = DEFAULT_LIMIT) -> DrainResult:
        """Run every job that is due now, and the jobs those enqueue, until none is left."""
        with self._turn():
            first, self._counts = len(self.attempts), dict.fromkeys((*_KIND_FIELD.values(), "delivered", "undelivered"), 0)
            self._first, self._stop_after = first, first + limit
            if self.driver.state is State.NEW:
                self._start()
            quiet_hints = 0
            for _ in range(100 * limit + 1000):  # a guard: every round runs an attempt or settles
                self._run_channel()
                now = self.clock.monotonic()
                wake = self.driver.next_wakeup()
                if wake is not None and wake <= now:
                    self._process(ev.Tick(now=now))
                    continue
                if self.driver.state is State.STOPPED:
                    raise PumpStuck("the pump was closed; make a new one")
                if self.driver.state is not State.RUNNING:
                    raise PumpStuck(
                        f"the pump is {self.driver.state.value} and cannot run jobs until time passes; call advance()"
                    )
                if self.driver.idle and (quiet_hints >= 2 or not self.store.has_due_jobs(self.options.policy.queues)):
                    if self._deliver():
                        quiet_hints = 0  # observers ran, and may have enqueued jobs
                        continue
                    break
                ran = len(self.attempts)
                self._process(ev.HintReceived(now=now))
                quiet_hints = quiet_hints + 1 if len(self.attempts) == ran and not self._channel else 0
            else:
                raise PumpStuck(f"drain() did not settle; the driver is {self.driver.state.value} (a bug: please report it)")
            return DrainResult(**self._counts, attempts=tuple(self.attempts[first:]))

    def _start(self) -> None:
        """What a worker does at start: write this database's share of BACKWAVE["SCHEDULES"] and
        ["QUEUES"] to its tables, then start the driver."""
        from backwave.databases import write_queue_settings
        from backwave.shell.schedules import sync_schedules

        sync_schedules(self.store, conf.get_setting("SCHEDULES"), self.registry, database=self._database)
        write_queue_settings(self._database, self.options.policy.queues)
        self._process(ev.Started(now=self.clock.monotonic()))

    def advance(self, seconds: float) -> None:
        """Move the virtual clock forward; ``drain()`` then runs what came due.

        Called from inside a task it says "this handler ran that long": a time limit passed
        meanwhile ends the attempt (TimeLimitExceeded, retried under the task's rules) before its
        report is heard, its context's ``should_stop()`` turns true, and a heartbeat due
        meanwhile is sent (bringing back a cancel requested during the run)."""
        self.clock.advance(seconds)

    def close(self) -> None:
        """Give the lease back (a clean drain of the driver). Safe to call twice."""
        with self._turn():
            if self.driver.state not in (State.NEW, State.STOPPED):
                self._stop_after = len(self.attempts)  # closing runs nothing more
                self._process(ev.DrainRequested(now=self.clock.monotonic(), timeout=0.0))
                self._run_channel()

    def __enter__(self) -> DeterministicPump:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- the loop -----------------------------------------------------------------------------

    def _run_channel(self) -> None:
        while self._channel:
            now = self.clock.monotonic()
            wake = self.driver.next_wakeup()
            if wake is not None and wake <= now:
                # A handler moved the clock (pump.clock.advance() inside a task: "this took that
                # long"): what came due meanwhile, a time limit above all, happens before its
                # report is heard, as a worker's pump thread would have ticked while it ran.
                self._process(ev.Tick(now=now))
                continue
            self._process(self._channel.popleft())
            if len(self.attempts) > self._stop_after:
                raise PumpStuck(
                    f"drain() ran more than {self._stop_after - self._first} attempts; does a task enqueue itself for ever? "
                    "Pass limit= to allow more."
                )

    def _process(self, event: ev.Event) -> None:
        self._executor.process(self.driver.handle, event, execute_job=self._run_job)

    def _run_job(self, job) -> None:
        arguments = dict(
            registry=self.registry,
            worker_id=self.worker_id,
            max_traceback_chars=conf.get_setting("MAX_TRACEBACK_CHARS"),
            max_result_bytes=conf.get_setting("MAX_RESULT_BYTES"),
            controls=self.controls,
            clock=self.clock.monotonic,
        )
        if is_async(job, self.registry):
            from asgiref.sync import async_to_sync

            report = async_to_sync(run_attempt_async)(job, **arguments, enter=self._scope.enter, leave=self._scope.leave)
        else:
            report = run_attempt(job, **arguments, enter=self._scope.enter, leave=self._scope.leave, commit=self._commit(job))
        if report.result == "committed":
            self._counts["succeeded"] = self._counts.get("succeeded", 0) + 1  # written by the attempt itself
        self.attempts.append(report)
        self._channel.append(
            ev.JobFinished(
                now=self.clock.monotonic(),
                job_id=job.id,
                attempt=job.attempt,
                result=report.result,
                jitter=self._random.random(),
                delay=report.delay,
                report=report,
            )
        )

    def _commit(self, job) -> Commit | None:
        """An atomic task's outcome is written by this pump's store (the test's connection, the
        virtual clock), inside the attempt's transaction, under the driver's lease."""
        if not is_atomic(job, self.registry):
            return None
        lease_id = self.driver.lease_id
        return Commit(
            alias=self._database,
            write=lambda _connection, record: self.store.write_outcomes_many(lease_id=lease_id, outcomes=[record]),
        )

    def _deliver(self) -> int:
        """One delivery pass of the due transitions to the observers, inline, each call in the
        attempt scope; how many it claimed."""
        if not len(self.observers):
            return 0
        token = uuid.UUID(int=self._random.getrandbits(128), version=4)
        records = self.store.claim_transitions(
            token=token, limit=self.delivery_options.batch, lease=self.delivery_options.lease, observers=self.observers.names
        )
        if not records:
            return 0
        results = deliver(
            records,
            self.observers,
            options=self.delivery_options,
            jitter=self._random.random,
            enter=self._scope.enter,
            leave=self._scope.leave,
        )
        self.store.settle_transitions(token=token, results=results)
        for result in results:
            key = "delivered" if result.failed_observer is None else "undelivered"
            self._counts[key] = self._counts.get(key, 0) + 1
        return len(records)

    def _applied(self, outcome, written) -> None:
        """Count what the store applied (as it was written) and send task_finished for it."""
        field = _KIND_FIELD[(written or outcome).kind]
        self._counts[field] = self._counts.get(field, 0) + 1
        if outcome.report is not None:
            send_finished(outcome.report, written)

    def _turn(self):
        if self._busy:
            raise RuntimeError("the test pump was called from inside a task it is running; call it from the test instead")
        return _Turn(self)


class _Turn:
    """Marks the pump busy for one call, so a task that calls back into it fails clearly."""

    __slots__ = ("_pump",)

    def __init__(self, pump: DeterministicPump):
        self._pump = pump

    def __enter__(self) -> None:
        self._pump._busy = True

    def __exit__(self, *exc_info: object) -> None:
        self._pump._busy = False


class _HandlerLeftTransactionOpen(Exception):
    """Raised into an atomic block a handler entered and never left, to roll it back."""


class _InlineScope:
    """The attempt scope of the test pump: a savepoint instead of the worker's connection care.

    The worker's scope may close the connection after a handler; in a test that would end the
    test's transaction. Here the handler runs in a savepoint (when the test runs inside a
    transaction): kept when the handler leaves the transaction healthy, rolled back when it
    leaves it aborted. An atomic block the handler entered and never left is rolled back, as the
    worker's scope rolls it back by dropping the connection.
    """

    def __init__(self, alias: str):
        self._alias = alias
        self._stack: list[tuple[str | None, int]] = []

    def enter(self) -> None:
        connection = connections[self._alias]
        savepoint = transaction.savepoint_create(using=self._alias) if connection.in_atomic_block else None
        self._stack.append((savepoint, len(connection.atomic_blocks)))

    def leave(self) -> None:
        savepoint, depth = self._stack.pop()
        connection = connections[self._alias]
        while len(connection.atomic_blocks) > depth:
            error = _HandlerLeftTransactionOpen("a task entered transaction.atomic() and never left it; its work is rolled back")
            connection.atomic_blocks[-1].__exit__(type(error), error, None)
        if savepoint is None:
            return
        if _aborted(connection):
            connection.needs_rollback = False  # Django refuses any statement, the rollback too, until this is cleared
            transaction.savepoint_rollback(savepoint, using=self._alias)
        else:
            transaction.savepoint_commit(savepoint, using=self._alias)


def _aborted(connection) -> bool:
    from psycopg.pq import TransactionStatus

    raw = connection.connection
    return connection.needs_rollback or (raw is not None and raw.info.transaction_status == TransactionStatus.INERROR)


def _observers(observers) -> ObserverRegistry:
    if observers is None:
        return ObserverRegistry.discover(conf.get_setting("TASK_MODULES"))
    found: list[Observer] = []
    for item in observers:
        if isinstance(item, Observer):
            found.append(item)
            continue
        module = importlib.import_module(item) if isinstance(item, str) else item
        if not isinstance(module, ModuleType):
            raise TypeError(f"observers= takes functions decorated with @observe, modules or module paths, got {item!r}")
        found.extend(value for value in vars(module).values() if isinstance(value, Observer))
    return ObserverRegistry(found)


def _registry(tasks) -> TaskRegistry:
    if tasks is None:
        return TaskRegistry.discover(conf.get_setting("TASK_MODULES"))
    found: list[Task] = []
    for item in tasks:
        if isinstance(item, Task):
            found.append(item)
            continue
        module = importlib.import_module(item) if isinstance(item, str) else item
        if not isinstance(module, ModuleType):
            raise TypeError(f"tasks= takes Task objects, modules or module paths, got {item!r}")
        found.extend(value for value in vars(module).values() if isinstance(value, Task))
    return TaskRegistry(found)


def _options(registry: TaskRegistry, *, queues, group, options, overrides, database) -> WorkerGroupOptions:
    if options is not None and group is not None:
        raise ValueError("pass options= or group=, not both")
    if group is not None:
        configured = {raw.get("name"): raw for raw in conf.get_setting("WORKER_GROUPS")}
        if group not in configured:
            raise ValueError(
                f"no worker group {group!r} in BACKWAVE['WORKER_GROUPS'] (configured: {sorted(map(str, configured))})"
            )
        options = conf.group_from_mapping(configured[group])
    retention = Retention(**conf.retention())  # cluster-wide, as the worker sets it
    if options is None:
        names = queues if queues is not None else _known_queues(registry, database)
        # One job at a time, each written before the next is claimed: a test reads the attempts
        # in the order the jobs ran. Claiming ahead would batch their writes (and it saves no
        # round-trip a test waits for: handlers run inline).
        options = WorkerGroupOptions(
            name="backwave-test",
            policy=Strict(*dict.fromkeys(names)),
            pool_size=1,
            claim_ahead=0,
            lease_duration=TEST_LEASE_DURATION,
            retention=retention,
        )
    elif group is not None:
        options = replace(options, retention=retention)
    if queues is not None:
        options = replace(options, policy=Strict(*dict.fromkeys(queues)))
    (options,) = validate_groups([replace(options, **overrides) if overrides else options])
    return options


def _known_queues(registry: TaskRegistry, database: str) -> list[str]:
    """Every queue of the BackWave backends in TASKS that enqueue into ``database`` (in the order
    of their QUEUES), then those of the registered tasks whose jobs live there: the order a
    Strict policy claims them in."""
    from backwave.databases import backwave_backends, queue_databases

    backends = backwave_backends()
    names: dict[str, None] = {}
    for backend in backends:
        if backend.database == database:
            names.update(dict.fromkeys(map(str, settings.TASKS[backend.alias].get("QUEUES", ()))))
    on_database = {b.alias for b in backends if b.database == database}
    for name in sorted(
        task.queue_name
        for task in registry.values()
        if task.backend in on_database or database in queue_databases(task.queue_name, backends)
    ):
        names[name] = None
    return list(names) or ["default"]

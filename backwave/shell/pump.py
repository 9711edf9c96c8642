"""The pump: one claim -> dispatch -> report loop on its own thread.

Theory of operation
-------------------
The pump owns a Node Driver, a store connection and a pool of ``pool_size`` worker threads. Its
loop is the only reader of a single event channel: worker threads post ``JobFinished``, the
process posts ``DrainRequested``, the hint listener posts ``HintReceived``; when nothing arrives
before the driver's next deadline the loop makes a ``Tick``, and a pump too busy ever to wait
makes one once a deadline has passed (asked after each store call and every 64 events: its
heartbeat must not wait for a pause that never comes). Each event goes to the driver, and the
commands that come back run in order, so exactly one store round-trip is in flight per pump. A
command's result is fed back to the driver as the next event, behind only the finished jobs that
came in while it ran (so the write that result prompts takes their outcomes along). Handlers run
on the pool, never on the loop.

The writes and claims (a busy pump's one round-trip per batch) run on the pump's store thread
while this thread waits for their answer *and* goes on feeding the driver the jobs that finish
meanwhile, starting at once the jobs claimed ahead that those finishes make room for: the
handlers are not idle while PostgreSQL writes one batch and claims the next. Any other event
that comes in meanwhile waits, with all after it, until the answer has been handled. The store
connection is used by one thread at a time: the pump thread makes no store call of its own while
one is on the store thread, and waits for every answer, even when it is leaving.

Threads: only the pump's own thread reads or writes its driver (the driver's state is plain,
unlocked Python objects). What other threads need (the worker's idle check, the health endpoint,
the throughput log, the hint pre-check) they read from ``snapshot``, an immutable ``PumpSnapshot``
the pump thread publishes after each event. A hint costs the listener one flag test: at most one
``HintReceived`` waits in the channel at a time (the pump lowers the flag when it takes it), so a
burst of NOTIFYs wakes the loop once.

The store commands run in the executor (``backwave/shell/executor.py``), the one interpreter the
test pump and the simulator share: a ``WriteOutcomes`` followed by a ``ClaimJobs`` goes out as one
pipelined round-trip (the write lands first, then the claim), which is how a pump at steady state
spends one round-trip per batch. The pump adds its loop, its threads and the hooks below.

Reports: a worker thread posts each attempt's report inside its ``JobFinished``; it rides on the
driver's Outcome and comes back with the ``WriteOutcomes``, so the pump keeps no map of reports
and one dropped with its outcome (a lost lease, an abandoned attempt) is simply gone. Once a
write lands, Django's ``task_finished`` is sent here, on this thread, once per outcome the store
applied (never for one the fence refused), with the status that was stored. The worker's
metrics count each of those outcomes here too, and an atomic task's success, which its attempt
wrote and signalled itself, when its ``JobFinished`` reaches this thread.

Faults: a transient store fault marks the pump degraded and is reported to the driver as
``StoreFailed`` (it retries on a later tick after a jittered backoff; the store reconnects on
that call, and the outcome buffer survives the reconnect). Anything else (an event the driver
rejects, an unexpected exception) halts this pump only: it stops claiming, its lease lapses,
other pumps inherit its jobs, and the process keeps running.

Health: the pump writes its row (``Pump`` model) when its lease opens, after each heartbeat that
lands and whenever its status changes, never per job; a halted pump records its reason before
its thread ends, and a pump that drains cleanly deletes its row. A pump is *stalled* when no store
call of its own has completed for longer than its lease, whatever the reason (every call failing
transiently, a call that hangs, a thread that never gets back to its loop): it does no work and
holds no lease, so the worker's health counts it unhealthy, and its row, no longer refreshed,
goes stale for ``backwave_health`` and the admin.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import logging
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.backoff import fault_delay
from backwave.core.driver import NodeDriver, State
from backwave.core.options import WorkerGroupOptions
from backwave.store.contract import NOTHING_OBSERVED, PumpHealth, Store, StoreError, TransientStoreError
from backwave.store.in_transaction import prepares_atomic_writes, write_outcome

from .execution import (
    DEFAULT_MAX_RESULT_BYTES,
    AttemptControls,
    AttemptReport,
    Commit,
    is_async,
    is_atomic,
    run_attempt,
    run_attempt_async,
    send_finished,
    send_finished_for,
)
from .executor import Executor
from .metrics import PumpTally
from backwave.core.health import DEGRADED, HALTED, HEALTHY
from backwave.core.jobs import OutcomeKind
from backwave.tasking.registry import TaskRegistry

logger = logging.getLogger("backwave.pump")

# While its channel never runs dry, a pump publishes its snapshot at least every this many events.
SNAPSHOT_EVERY = 64


# How many stopped attempts a pump remembers for their task_finished (see Pump._stopped).
_STOPPED_KEPT = 1000


class PumpSnapshot(NamedTuple):
    """The driver's state as other threads may know it, published by the pump thread after each
    event (replacing the reference is atomic; a tuple never changes). A NamedTuple: it is built
    per event, on the hot path."""

    idle: bool
    executing: int
    in_flight: int  # claimed and not yet reported
    claimed_ahead: int  # of those, waiting for a thread (not started)
    free_slots: int
    applied: int  # outcomes the fence let through, since start
    abandoned: int  # attempts given up on (lost lease, drain deadline), since start

    @classmethod
    def of(cls, driver: NodeDriver) -> PumpSnapshot:
        stats = driver.stats
        return cls(
            driver.idle,
            driver.executing,
            driver.unreported,
            driver.claimed_ahead,
            driver.free_slots,
            stats.applied,
            stats.abandoned,
        )


class _HintFlag:
    """Raised by whoever posts a hint, lowered by the pump thread when it takes the hint: a
    test-and-set, so two posters (one listener per database) never post two."""

    __slots__ = ("_lock", "_raised")

    def __init__(self):
        self._lock = threading.Lock()
        self._raised = False

    def raise_(self) -> bool:
        """Raise the flag; True when it was down (the caller posts the hint)."""
        with self._lock:
            if self._raised:
                return False
            self._raised = True
            return True

    def lower(self) -> None:
        with self._lock:
            self._raised = False


class PoolExhausted(RuntimeError):
    """A job was handed to a pool with no free thread: it would wait, claimed and unstarted."""


class WorkerPool:
    """``size`` handler threads fed by one queue: the pump's Workers.

    Leaner than ThreadPoolExecutor on the hot path (no Future per job): a claimed job is one
    ``SimpleQueue.put``. The driver guarantees that no more than ``size`` handlers ever run at
    once (abandoned ones included), so none waits for a thread; ``submit`` checks it, and a job
    that would wait raises ``PoolExhausted`` instead (the pump halts: its lease lapses and the
    job runs elsewhere, rather than sitting in the queue behind a hung handler).

    ``run(job)`` runs a handler and returns its report; ``done(job, report)`` is called after the
    thread counts as free again, so a job claimed for the slot that report frees finds it free.
    """

    _STOP = object()

    def __init__(self, size: int, run: Callable, done: Callable, *, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._run = run
        self._done = done
        self._size = size
        self._name = name
        # One token per free thread. A SimpleQueue rather than a Semaphore: taking and giving
        # back a token are single C calls, where the Semaphore's Python-level Condition cost the
        # pump thread and the handler about a microsecond each per job.
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(size):
            self._free.put(None)
        # Started with the first job, not here: the pump builds its pool before its thread opens
        # the lease, and 64 threads started first put 6-9 ms before a worker's first claim
        # (45-140 ms beside a busy core). All at once then, before that job runs, so the first
        # batch's outcomes are not split by a linger that expired while threads were starting.
        # Only the pump's thread submits and shuts down, so the list needs no lock.
        self._threads: list[threading.Thread] = []

    def submit(self, job, *arguments) -> None:
        """Run ``run(job, *arguments)`` on a free thread (the pump passes an atomic job's Commit)."""
        try:
            self._free.get_nowait()
        except queue.Empty:
            raise PoolExhausted(
                f"job {job.id} was handed to a pool whose {self._size} thread(s) are all running handlers"
            ) from None
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._work, name=f"{self._name}_{i}", daemon=True) for i in range(self._size)
            ]
            for thread in self._threads:
                thread.start()
        self._queue.put((job, arguments))

    def shutdown(self) -> None:
        """Let idle threads exit; a thread still running a handler exits when it returns."""
        for _ in self._threads:
            self._queue.put(self._STOP)

    def _work(self) -> None:
        while (item := self._queue.get()) is not self._STOP:
            self._run_one(*item)

    def _run_one(self, job, arguments) -> None:
        # A frame of its own: the report is not kept alive by an idle thread waiting for its next job.
        try:
            report = self._run(job, *arguments)
        except BaseException:  # run_attempt never raises; this is the last line of defence
            logger.exception("A worker thread failed outside its job")
            self._free.put(None)
            return
        self._free.put(None)
        self._done(job, report)


class StoreThread:
    """The thread a pump's writes and claims run on while the pump's own thread goes on taking
    finished jobs (see ``Pump._aside``). One call at a time: the pump thread submits one and
    waits for its answer before it makes any other store call, so the store's connection is
    used by one thread at a time, in the pump's order. Started with the first call; a daemon,
    as the pump's own thread is, so a call that hangs never holds the process's exit."""

    def __init__(self, post: Callable[[Future], None], *, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._post = post
        self._name = name
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], object]) -> None:
        """Run ``call``; its answer (or its error) is posted as a done Future."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self._calls.put(call)

    def shutdown(self) -> None:
        if self._thread is not None:
            self._calls.put(None)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            self._post(self._answer(call))

    @staticmethod
    def _answer(call: Callable[[], object]) -> Future:
        # A frame of its own: neither the call nor its answer is kept alive by an idle thread.
        answer: Future = Future()
        try:
            answer.set_result(call())
        except BaseException as error:  # the pump thread raises it, as if it had made the call
            answer.set_exception(error)
        return answer


class EventLoopThread:
    """An asyncio event loop on a daemon thread, where a pump's ``async def`` tasks run."""

    def __init__(self, *, name: str):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def shutdown(self) -> None:
        """Stop the loop once the coroutines still running have been given up on (drain is over)."""
        self._loop.call_soon_threadsafe(self._loop.stop)


class Pump:
    """One pump of a worker group. ``start()`` runs it on a thread; ``drain()`` stops it gently."""

    def __init__(
        self,
        options: WorkerGroupOptions,
        index: int,
        *,
        store_factory: Callable[[], Store],
        registry: TaskRegistry,
        max_traceback_chars: int = 16_000,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.options = options
        self.index = index
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{options.name}:{index}:{uuid.uuid4().hex[:8]}"
        self.driver = NodeDriver(options)  # the pump thread's alone: others read ``snapshot``
        self.snapshot = PumpSnapshot.of(self.driver)
        self._unpublished = 0  # events handled since the snapshot was last published
        self._tally = PumpTally()  # the pump thread's; the metrics read ``tally_snapshot``
        self.tally_snapshot = self._tally.publish()
        self._hint_flag = _HintFlag()
        self.health = HEALTHY
        self.health_reason = ""
        self._store_factory = store_factory
        self._registry = registry
        self._max_traceback_chars = max_traceback_chars
        self._max_result_bytes = max_result_bytes
        self._clock = clock
        self._channel: queue.SimpleQueue[ev.Event] = queue.SimpleQueue()
        # Events taken from the channel while a store call ran that are not finished jobs (and
        # all that came after the first of them): they come next, in the order they came.
        self._backlog: collections.deque[ev.Event] = collections.deque()
        self._random = random.Random()
        # When a store call of this pump last completed (its clock): written by the pump thread,
        # read by the health endpoint. Counted from start, so a pump that never reached the
        # database stalls too.
        self._store_answered_at = clock()
        self._stop_now = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"backwave-pump-{options.name}-{index}", daemon=True)
        self._pool = WorkerPool(options.pool_size, self._run_job, self._finished, name=f"backwave-{options.name}-{index}")
        self._loop: EventLoopThread | None = None
        self._store_thread = StoreThread(self._channel.put, name=f"backwave-pump-{options.name}-{index}-store")
        self.controls = AttemptControls()  # the running attempts' stop flags and progress
        # The attempts this pump's driver told to stop, by (job id, attempt), until their outcome
        # is applied: one the driver ends itself (a time limit) has no handler report to send
        # task_finished from. Pump thread only; bounded, as a refused outcome never comes back.
        self._stopped: dict[tuple[int, int], object] = {}
        self._executor = Executor(
            None,  # the store, once it is open: see _store
            options=options,
            worker_id=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            clock=clock,
            jitter=self._random.random,
            time_zone=timezone.get_default_timezone,
            new_lease_id=uuid.uuid4,
            on_applied=self._applied,
            on_lease_held=self._report_health,  # the health row's heartbeat rides the lease's cadence
            on_fault=self._degrade,
            on_answered=self._recovered,
            progress=self.controls.reports,  # batched with the heartbeat, never a statement per call
            stop_attempt=self._stop_attempt,
            logger=logger,
        )
        self._abandoned_before = 0
        # The same for every attempt of this pump (its worker id is fixed at birth).
        self._attempt_arguments = dict(
            registry=registry,
            worker_id=self.worker_id,
            max_traceback_chars=max_traceback_chars,
            max_result_bytes=max_result_bytes,
            controls=self.controls,
        )
        self._task_kinds: dict[str, tuple[bool, bool]] = {}

    @property
    def _store(self) -> Store | None:
        """The pump's store connection (None until it opens), held by its executor alone."""
        return self._executor.store

    @_store.setter
    def _store(self, store: Store | None) -> None:
        self._executor.store = store

    # ---- control from other threads -------------------------------------------------------------

    def start(self) -> None:
        self._store_answered_at = self._clock()
        self._thread.start()

    def drain(self, timeout: float | None = None) -> None:
        """Stop claiming, let running jobs finish within ``timeout`` seconds, give back the rest."""
        timeout = self.options.drain_timeout if timeout is None else timeout
        self._channel.put(ev.DrainRequested(now=self._clock(), timeout=timeout))

    def hint(self) -> None:
        """A Wake-Up Hint for one of this pump's queues (called from the listener thread).

        Reads no driver state. A pump whose last snapshot had no free slot has nothing to claim
        with (when slots reopen through a write, the driver claims anyway), and while one hint
        waits in the channel another adds nothing: neither wakes the loop. The driver's
        pending-poll slot coalesces the rest, so a burst of hints costs at most one extra claim.
        """
        if self.snapshot.free_slots and self._hint_flag.raise_():
            self._channel.put(ev.HintReceived(now=self._clock()))

    def own_session(self) -> int | None:
        """The process id of this pump's store session on the server (None before it connects),
        read by the listener thread: a hint that session sent is one of this pump's own writes,
        whose driver claims what it made ready without it (a chain's every link was a second,
        empty claim)."""
        return getattr(self._store, "session_pid", None)

    def cancel_requested(self, job_id: int, by: str) -> None:
        """A cancel of a running job was heard (from the listener thread): tell the driver, which
        knows whether it runs here. The heartbeat tells it too, should this be lost."""
        # Posted whether or not it runs here (cancels are rare, and the driver knows best): a
        # check here could miss a job claimed a moment ago.
        self._channel.put(ev.CancelRequested(now=self._clock(), job_id=job_id, by=by))

    def stop_now(self) -> None:
        """Leave at once: nothing more is written; the lease lapses and others take over."""
        self._stop_now.set()
        self._channel.put(ev.Tick(now=self._clock()))

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def seconds_since_store_call(self) -> float:
        """Seconds since a store call of this pump last completed (or since it started)."""
        return max(0.0, self._clock() - self._store_answered_at)

    @property
    def stalled(self) -> bool:
        """Alive, not halted, and no store call has completed for longer than its lease."""
        return self.alive and self.health != HALTED and self.seconds_since_store_call > self.options.lease_duration

    @property
    def round_trips(self) -> int:
        return getattr(self._store, "round_trips", 0)

    # ---- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._store = self._open_store()
            if self._store is None:
                return  # drained or stopped before the database ever answered: nothing was held
            self._process(ev.Started(now=self._clock()))
            while self.driver.state is not State.STOPPED and not self._stop_now.is_set():
                self._process(self._next_event())
            if self.driver.state is State.STOPPED:
                self._forget_health()  # a clean stop: nothing to watch any more
        except Exception as error:
            self._halt(error)
        finally:
            self._publish()  # the last word on what it did, for the worker's closing line
            # Never wait here: after a clean drain nothing is running, and after a drain deadline,
            # a halt or a stop, the handlers still running belong to jobs already given up on.
            self._pool.shutdown()
            self._store_thread.shutdown()  # idle: the pump thread waits for every call it hands over
            if self._loop is not None:
                self._loop.shutdown()
            if self._store is not None:
                try:
                    self._store.close()
                except Exception:
                    logger.debug("Closing the store of %s failed", self.worker_id, exc_info=True)

    def _open_store(self) -> Store | None:
        """The pump's store. While the database cannot be reached (a worker started during a
        restart), the pump is degraded and retries with a jittered backoff; None if asked to
        drain or stop meanwhile."""
        streak = 0
        while not self._stop_now.is_set():
            try:
                store = self._store_factory()
                self._store_answered_at = self._clock()
                return store
            except TransientStoreError as error:
                self._degrade(error)
                streak += 1
                delay = fault_delay(
                    streak=streak,
                    base=self.options.poll_interval,
                    cap=self.options.fault_backoff_cap,
                    jitter=self._random.random(),
                )
            try:
                event = self._take(timeout=delay)
            except queue.Empty:
                continue
            if isinstance(event, ev.DrainRequested):
                return None
        return None

    def _next_event(self) -> ev.Event:
        if self._backlog:
            return self._hint_taken(self._backlog.popleft())
        if self._channel.empty():
            # Published when the pump is about to wait (what it shows then is what an idle check
            # or a hint needs) and at least every SNAPSHOT_EVERY events while it is busy: building
            # it after every event cost more than the driver's own handling of a finished job.
            self._publish()
            wake = self.driver.next_wakeup()
            timeout = None if wake is None else max(0.0, wake - self._clock())
            try:
                return self._take(timeout=timeout)
            except queue.Empty:
                return ev.Tick(now=self._clock())
        if self._unpublished >= SNAPSHOT_EVERY:
            self._publish()
            # Asked here every SNAPSHOT_EVERY events, so no stream of events holds a deadline
            # back for longer (the executor asks after every store call too).
            if (tick := self._due()) is not None:
                return tick
        # An event already waits, and this thread alone takes from the channel: a wait would end
        # at once whatever its timeout, so the driver's next wake-up is not asked for (it asks
        # every part of the driver, and a busy pump comes here once per finished job).
        return self._take(timeout=None)

    def _arrived(self) -> list[ev.JobFinished]:
        """The finished jobs that came in while a store call ran, taken from the head of the
        backlog and then of the channel; the first event of another kind stops the take and
        waits at the head of the backlog, to be the next event (so the order of the rest is kept)."""
        finished: list[ev.JobFinished] = []
        backlog = self._backlog
        while True:
            if not backlog:
                try:
                    backlog.append(self._channel.get_nowait())
                except queue.Empty:
                    break
            if not isinstance(backlog[0], ev.JobFinished):
                break
            finished.append(backlog.popleft())
        return finished

    def _aside(self, call: Callable[[], object], early: Callable[[ev.Event], None]):
        """Run a write's or a claim's store call on the store thread and return its answer;
        meanwhile each finished job that comes in goes to ``early`` (the executor feeds it to
        the driver, whose answer may start a job claimed ahead on the thread that job freed).

        Without this the pump thread waited in the call, and with it every handler thread
        whose job ended: a pump of 16 threads spent half its time idle while PostgreSQL wrote
        one batch and claimed the next. An event of any other kind, and all that come after it,
        wait in the backlog, so the driver sees every event in the order it came (a hint is
        counted as taken only when the driver gets it: one at most waits, however many NOTIFYs
        come meanwhile). Every call is waited for, even after ``early`` fails: the connection is
        the call's until it answers."""
        self._store_thread.submit(call)
        backlog = self._backlog
        failure: BaseException | None = None

        def feed_finished() -> None:
            nonlocal failure
            while failure is None and backlog and isinstance(backlog[0], ev.JobFinished):
                try:
                    early(backlog.popleft())
                except BaseException as error:
                    failure = error

        feed_finished()
        while not isinstance(item := self._channel.get(), Future):
            backlog.append(item)
            feed_finished()
        if failure is not None:
            raise failure
        return item.result()

    def _take(self, timeout: float | None) -> ev.Event:
        return self._hint_taken(self._channel.get(timeout=timeout))

    def _hint_taken(self, event: ev.Event) -> ev.Event:
        if isinstance(event, ev.HintReceived):
            # Lowered before the driver acts on it: a NOTIFY that arrives from now on posts a new
            # hint, and one that found the flag raised came before the claim this hint may send.
            self._hint_flag.lower()
        return event

    def _process(self, event: ev.Event) -> None:
        self._executor.process(
            self._handle,
            event,
            execute_job=self._submit,
            stop=self._stop_now.is_set,
            arrived=self._arrived,
            aside=self._aside,
            due=self._due,
        )

    def _due(self) -> ev.Tick | None:
        """A Tick when a deadline of the driver (a heartbeat, a linger, a time limit) passed
        while the pump was too busy to wait for one: its channel never ran dry."""
        wake = self.driver.next_wakeup()
        if wake is None:
            return None
        now = self._clock()
        return ev.Tick(now=now) if wake <= now else None

    def _handle(self, event: ev.Event) -> list[cmd.Command]:
        """Feed the driver one event; say so when that made it give its lease up."""
        had_lease = self.driver.lease_id is not None and self.driver.state is State.RUNNING
        self._unpublished += 1
        if type(event) is ev.JobFinished and event.result == "committed":
            # An atomic task's success, written by its attempt in its own transaction: no batch
            # write will apply it, so it is counted here, as it reaches this thread.
            report = event.report
            self._tally.applied(report.queue, report.task_path, OutcomeKind.SUCCEEDED, report.duration)
        commands = self.driver.handle(event)
        if isinstance(event, ev.LeasesExpired):
            self._tally.expired(event.released)
        if had_lease and self.driver.state is State.OPENING:
            self._tally.lost_lease()
            logger.warning(
                "Pump %s gave up its lease (%s); %d job(s) it was running will run again elsewhere, and it opens a new lease",
                self.worker_id,
                "it was expired elsewhere" if isinstance(event, ev.LeaseRenewed) else "no heartbeat landed within the lease",
                self.driver.stats.abandoned - self._abandoned_before,
            )
        self._abandoned_before = self.driver.stats.abandoned
        return commands

    def _publish(self) -> None:
        self.snapshot = PumpSnapshot.of(self.driver)
        self.tally_snapshot = self._tally.publish()
        self._unpublished = 0

    def _submit(self, job) -> None:
        self.controls.register(job)
        runs_async, atomic = self._task_kind(job)
        if runs_async:
            self._event_loop().submit(self._run_async_job(job))
        elif atomic:
            self._pool.submit(job, self._commit(job))
        else:
            self._pool.submit(job)

    def _task_kind(self, job) -> tuple[bool, bool]:
        """(async, atomic) of the job's task, looked up once per task path: the registry is
        frozen after discovery, and this is asked for every job handed over."""
        kind = self._task_kinds.get(job.task_path)
        if kind is None:
            kind = self._task_kinds[job.task_path] = (is_async(job, self._registry), is_atomic(job, self._registry))
        return kind

    @functools.cached_property
    def _atomic_database(self) -> tuple[str, bool]:
        """The alias atomic tasks commit on, and whether their writes are prepared there (read
        from its settings on the first atomic job)."""
        alias = self.options.database or DEFAULT_DB_ALIAS
        return alias, prepares_atomic_writes(connections[alias].settings_dict)

    def _commit(self, job) -> Commit:
        """How an atomic task's attempt writes its success: on the handler thread's Django
        connection to this pump's database, fenced by the lease the job was claimed under (read
        here, on the pump's thread, which owns the driver)."""
        lease_id, observed = self.driver.lease_id, getattr(self._store, "observed", NOTHING_OBSERVED)
        plain = not getattr(self._store, "claimed_with_dependents", lambda _job_id: True)(job.id)
        alias, prepare = self._atomic_database
        return Commit(
            alias=alias,
            write=lambda connection, record: write_outcome(
                connection, lease_id=lease_id, record=record, observed=observed, plain=plain, prepare=prepare
            ),
        )

    # ---- jobs -------------------------------------------------------------------------------------

    def _run_job(self, job, commit=None) -> AttemptReport:
        return run_attempt(job, commit=commit, **self._attempt_arguments)

    async def _run_async_job(self, job) -> None:
        self._finished(job, await run_attempt_async(job, **self._attempt_arguments))

    def _stop_attempt(self, command) -> None:
        if (control := self.controls.stop(command.job_id, command.attempt, command.reason)) is not None:
            logger.warning(
                "Pump %s: job %s attempt %s told to stop (%s)", self.worker_id, command.job_id, command.attempt, command.reason
            )
            if len(self._stopped) >= _STOPPED_KEPT:
                del self._stopped[next(iter(self._stopped))]
            self._stopped[(command.job_id, command.attempt)] = control

    def _event_loop(self) -> EventLoopThread:
        # Started on the first async job: a pump that runs only sync tasks never has one. The
        # driver already bounds what runs at once to pool_size, async and sync together.
        if self._loop is None:
            self._loop = EventLoopThread(name=f"backwave-{self.options.name}-{self.index}-loop")
        return self._loop

    def _finished(self, job, report: AttemptReport) -> None:
        self._channel.put(
            ev.JobFinished(
                now=self._clock(),
                job_id=job.id,
                attempt=job.attempt,
                result=report.result,
                jitter=self._random.random(),
                delay=report.delay,
                report=report,
            )
        )

    def _applied(self, outcome, written) -> None:
        report = outcome.report
        control = self._stopped.pop((outcome.job_id, outcome.attempt), None)
        if report is not None:
            # Counted as stored: an outcome the store could not write is stored as a failure.
            self._tally.applied(
                report.queue, report.task_path, outcome.kind if written is None else written.kind, report.duration
            )
            send_finished(report, written)
        elif control is not None and control.started_as is not None and written is not None:
            # Ended by the driver (a time limit) while its handler runs on: what was stored is
            # the driver's record. A copy of the attempt's TaskResult, which its handler's thread
            # may still be changing.
            running, sender, queue_name, task_path = control.started_as
            result = copy.copy(running)
            object.__setattr__(result, "errors", list(running.errors))
            self._tally.applied(queue_name, task_path, written.kind, control.elapsed())
            send_finished_for(result, sender, written)

    # ---- health -----------------------------------------------------------------------------------

    def health_row(self) -> PumpHealth:
        """This pump's health as it is written to the store (and served by the health endpoint)."""
        return PumpHealth(
            worker_id=self.worker_id,
            group=self.options.name,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            status=self.health,
            reason=self.health_reason,
            in_flight=self.snapshot.in_flight,
            lease_duration=self.options.lease_duration,
            queues=self.options.policy.queues,
        )

    def _report_health(self) -> None:
        """Write the health row; a failure is logged, never raised: the next report retries."""
        if self._store is None:
            return
        try:
            self._store.record_pumps_many(pumps=[self.health_row()])
        except StoreError as error:
            logger.debug("Pump %s could not record its health (%s): %s", self.worker_id, self.health, error)

    def _degrade(self, error: Exception) -> None:
        self.health_reason = str(error)
        if self.health == HEALTHY:
            logger.warning("Pump %s degraded: %s", self.worker_id, error)
            self.health = DEGRADED
            # Written only when the store still answers (a lock or statement timeout); with the
            # connection lost this fails fast, and the row says healthy again once it is back.
            self._report_health()

    def _recovered(self) -> None:
        """A store call completed."""
        self._store_answered_at = self._clock()
        if self.health == DEGRADED:
            logger.info("Pump %s recovered", self.worker_id)
            self.health = HEALTHY
            self.health_reason = ""
            self._report_health()

    def _halt(self, error: Exception) -> None:
        self.health = HALTED
        self.health_reason = f"{type(error).__name__}: {error}"
        logger.error("Pump %s halted; its lease will lapse and other pumps take its jobs", self.worker_id, exc_info=error)
        # Recorded before the thread ends, so operators see which pump stopped and why.
        try:
            if self._store is None:
                self._store = self._store_factory()
            self._store.record_pumps_many(pumps=[self.health_row()])
        except Exception:
            logger.warning("Pump %s could not record that it halted", self.worker_id, exc_info=True)

    def _forget_health(self) -> None:
        try:
            self._store.forget_pumps_many(worker_ids=[self.worker_id])
        except StoreError as error:
            logger.debug("Pump %s could not delete its health row: %s", self.worker_id, error)

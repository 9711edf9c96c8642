"""A worker process: the configured groups' pumps (on every database they serve), signals,
graceful drain, throughput log (for intervals in which jobs ran)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property, partial

from django.db import DEFAULT_DB_ALIAS

from backwave.core.options import WorkerGroupConfigError, WorkerGroupOptions, validate_groups
from backwave.store.contract import Store, StoreError

from backwave.core.deliveries import DeliveryOptions
from backwave.observers import NO_OBSERVERS, ObserverRegistry

from .execution import DEFAULT_MAX_RESULT_BYTES
from .observers import ObserverLoop
from .hints import HintListener
from .vacuum import JobTableCleaner
from .health import HealthServer, group_status, overall_status, process_status
from backwave.core.health import UnservedQueue
from .metrics import exposition, worker_registry
from .pump import HALTED, Pump
from .supervisor import REPLACE_ME
from backwave.tasking.registry import TaskRegistry

logger = logging.getLogger("backwave.worker")


def _observing(store_factory: Callable[[str], Store], observers: ObserverRegistry) -> Callable[[str], Store]:
    """``store_factory`` whose stores note the transitions ``observers`` watch."""
    if not len(observers):
        return store_factory

    def factory(alias: str) -> Store:
        store = store_factory(alias)
        store.observed = observers.observed
        return store

    return factory


class Worker:
    """Runs every pump of the given groups until drained or stopped.

    Each group names the database its pumps serve (``WorkerGroupOptions.database``, set by
    ``backwave.databases.place_groups``); a group serving two databases comes as two entries with
    the same name. ``store_factory(alias)`` opens a store on a database; ``hints`` has one
    listener per database, and a pump hears only its own database's hints.
    """

    def __init__(
        self,
        groups: Iterable[WorkerGroupOptions],
        *,
        store_factory: Callable[[str], Store],
        registry: TaskRegistry,
        max_traceback_chars: int = 16_000,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        log_every: float = 10.0,
        hints: Mapping[str, HintListener] | None = None,
        cleaners: Mapping[str, JobTableCleaner] | None = None,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        health_listener: socket.socket | None = None,
        hard_time_limit: float | None = None,
        observers: ObserverRegistry = NO_OBSERVERS,
        delivery_options: DeliveryOptions | None = None,
    ):
        """``hard_time_limit``: seconds a handler told to stop (past its time limit, or
        cancelled) may go on before this process drains and ends itself with REPLACE_ME, for its
        supervisor to replace; None: such a handler keeps its thread until it returns."""
        groups = list(groups)
        self.hard_time_limit = hard_time_limit
        self.replacing = False  # a handler ran past its hard limit: this process is ending
        store_factory = _observing(store_factory, observers)
        for group in groups:
            if group.database is None:
                raise WorkerGroupConfigError(
                    f"Worker Group '{group.name}' names no database; place it first (backwave.databases.place_groups)."
                )
        # Names are unique per database: a group placed on two databases is one group.
        self.groups = [
            g
            for alias in dict.fromkeys(g.database for g in groups)
            for g in validate_groups(g for g in groups if g.database == alias)
        ]
        self.databases = list(dict.fromkeys(g.database for g in self.groups))
        # The endpoint binds first, so a port in use fails the command before any thread starts.
        # ``health_listener``: a listening socket made elsewhere (a supervisor's) to serve on instead.
        self.health_server = (
            None
            if health_port is None and health_listener is None
            else HealthServer(
                self.health_snapshot, host=health_host, port=health_port or 0, metrics=self.metrics, listener=health_listener
            )
        )
        self.pumps = []
        numbered: dict[str, int] = {}
        for group in self.groups:
            for _ in range(group.pumps):
                # Numbered across the group's databases, so its pump names stay distinct.
                index = numbered[group.name] = numbered.get(group.name, -1) + 1
                self.pumps.append(
                    Pump(
                        group,
                        index,
                        store_factory=partial(store_factory, group.database),
                        registry=registry,
                        max_traceback_chars=max_traceback_chars,
                        max_result_bytes=max_result_bytes,
                    )
                )
        self._log_every = log_every
        self.hints = dict(hints or {})
        if hints is not None and (missing := [alias for alias in self.databases if alias not in self.hints]):
            raise ValueError(f"no hint listener for database(s) {', '.join(missing)}")
        for pump in self.pumps:
            if pump.options.database in self.hints:
                self.hints[pump.options.database].subscribe(pump.options.policy.queues, pump.hint, own_session=pump.own_session)
                self.hints[pump.options.database].subscribe_cancels(pump.cancel_requested)
        # One job table cleanup per database served (backwave/shell/vacuum.py); none: autovacuum's.
        self.cleaners = dict(cleaners or {})
        self._signals = 0
        self._all_halted_logged = False
        self._done = threading.Event()
        self._store_factory = store_factory
        self._health_stores: dict[str, Store] = {}
        # Per database served: (monotonic time of the read, [(queue, seconds due)]) of the queues
        # with due jobs that no live pump anywhere serves, read at each refresh.
        self._unserved: dict[str, tuple[float, list[tuple[str, float]]]] = {}
        self._unserved_logged: set[tuple[str, str]] = set()
        # One observer loop per database served, when there is anything to observe.
        self.observer_loops = [
            ObserverLoop(
                store_factory=partial(store_factory, alias),
                registry=observers,
                options=delivery_options or DeliveryOptions(),
                name=alias,
            )
            for alias in (self.databases if len(observers) else ())
        ]

    @cached_property
    def metrics_registry(self):
        """Made at the first scrape: building it loads prometheus_client, which a worker's start
        to its first claim need not wait for. Two first scrapes at once may each make one; they
        read the same pumps, and the one kept serves the scrapes after."""
        return worker_registry(self)

    def metrics(self, accept: str | None = None) -> tuple[bytes, str]:
        """A Prometheus scrape of this worker: (body, content type) for the ``Accept`` header."""
        return exposition(self.metrics_registry, accept)

    def run(self, *, install_signal_handlers: bool = True, until_idle: bool = False) -> int:
        """Start the pumps and block until they stop. Returns the process exit code."""
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if self.health_server is not None:
            self.health_server.start()
        for pump in self.pumps:
            pump.start()
        for listener in self.hints.values():
            listener.start()
        for cleaner in self.cleaners.values():
            cleaner.start()
        for loop in self.observer_loops:
            loop.start()
        from backwave import __version__

        names = ", ".join(
            f"{g.name}[{', '.join(g.policy.queues)}]{self._on(g.database)} pool={g.pool_size} pumps={g.pumps}"
            for g in self.groups
        )
        logger.info(
            "BackWave worker started (version %s, pid %d, database%s %s): %s",
            __version__,
            os.getpid(),
            "s" if len(self.databases) > 1 else "",
            ", ".join(self.databases),
            names,
        )
        try:
            return self._watch(until_idle)
        finally:
            if self.health_server is not None:
                self.health_server.close()
            for store in self._health_stores.values():
                store.close()

    def _on(self, database: str) -> str:
        """Where a group runs, for the log: said whenever it is not simply the default database."""
        return "" if self.databases == [DEFAULT_DB_ALIAS] else f" on {database}"

    def _watch(self, until_idle: bool) -> int:
        """Log throughput (for intervals in which jobs ran), drain when idle (if asked), keep halted pumps' health rows fresh, and
        return the exit code once every pump has stopped (1 when every pump halted)."""
        last_time, last_done = time.monotonic(), 0
        idle_checks = 0
        refresh_every = min(g.heartbeat_every for g in self.groups)
        last_refresh = last_time
        # Every pump halted is a state, not an event seen in the loop: pumps that halt on a
        # refused connection may all be gone before the first check, and the process still stays.
        while any(p.alive for p in self.pumps) or (all(p.health == HALTED for p in self.pumps) and not self._signals):
            time.sleep(min(0.2, self._log_every))
            now = time.monotonic()
            if now - last_time >= self._log_every:
                done = self.jobs_done
                running = sum(p.snapshot.executing for p in self.pumps)
                # An idle worker stays quiet: a line every interval saying nothing happened would
                # bury the lines that matter (its idle polls still count as round-trips).
                if done != last_done or running:
                    logger.info(
                        "throughput: %.0f jobs/s (%d done, %d running, %d store round-trips); pumps: %s",
                        (done - last_done) / (now - last_time),
                        done,
                        running,
                        sum(p.round_trips for p in self.pumps),
                        ", ".join(p.health for p in self.pumps),
                    )
                last_time, last_done = now, done
            # Idle at two checks in a row: a snapshot published between a failed attempt's write
            # and the claim of its retry (due a moment later) reads idle for that moment.
            idle_checks = idle_checks + 1 if until_idle and self.idle else 0
            if idle_checks >= 2:
                self.drain()
            if self.hard_time_limit is not None and not self.replacing:
                self._enforce_hard_limit()
            if all(p.health == HALTED for p in self.pumps):
                for pump in self.pumps:
                    pump.join(10)  # each records its halt before its thread ends
                if until_idle or self._signals:
                    logger.error("Every pump is halted; the worker exits")
                    break  # through the listeners' stop below: the exit code is 1 (every pump halted)
                # Fail-stop halts pumps, not the process: it stays up, its health endpoint
                # answering 503 and its pump rows fresh, until an operator or orchestrator acts.
                if not self._all_halted_logged:
                    logger.error("Every pump is halted; the process stays up (health: halted) until it is signalled")
                    self._all_halted_logged = True
            if now - last_refresh >= refresh_every:
                last_refresh = now
                self._refresh_halted()
                self._check_unserved()
        for listener in self.hints.values():
            listener.stop()
        for cleaner in self.cleaners.values():
            cleaner.stop()
        # After the pumps: the transitions of their last outcomes are there to deliver by now.
        for loop in self.observer_loops:
            loop.stop()
        for loop in self.observer_loops:
            loop.join()
        logger.info(
            "BackWave worker stopped after %d job(s) and %d store round-trips%s",
            self.jobs_done,
            sum(p.round_trips for p in self.pumps),
            "; wake-up hints received: "
            + ", ".join(f"{alias} {listener.hints_received}" for alias, listener in self.hints.items())
            if self.hints
            else "",
        )
        return 1 if all(p.health == HALTED for p in self.pumps) else 0

    def health_snapshot(self) -> dict:
        """This process's health: each pump, each group (halted only when all its pumps are), and
        the wake-up hint listener (dead: unhealthy; reconnecting: degraded). A stalled pump (no
        store call completed for longer than its lease) makes the process unhealthy, whatever its
        own status says. Reads only what the pumps publish, never a driver: it runs on the
        endpoint's threads."""
        pumps = []
        for pump in self.pumps:
            row = pump.health_row()
            pumps.append(
                {
                    "worker_id": row.worker_id,
                    "group": row.group,
                    "database": pump.options.database,
                    "status": row.status,
                    "reason": row.reason,
                    "in_flight": row.in_flight,
                    "alive": pump.alive,
                    "stalled": pump.stalled,
                    "seconds_since_store_call": round(pump.seconds_since_store_call, 3),
                }
            )
        # A group is halted on a database once its pumps there all are: its pumps elsewhere cannot
        # take those jobs over, so the group reads halted too.
        groups = {
            name: overall_status(
                group_status(p["status"] for p in pumps if p["group"] == name and p["database"] == g.database)
                for g in self.groups
                if g.name == name
            )
            for name in dict.fromkeys(g.name for g in self.groups)
        }
        hints = {alias: listener.health() for alias, listener in self.hints.items()}
        hint_statuses = {each["status"] for each in hints.values()}
        queues = [
            {
                "queue": queue.name,
                "database": queue.database,
                "status": queue.status,
                "due_for": round(queue.due_for, 1),
                "reason": queue.reason,
            }
            for queue in self.unserved_queues()
        ]
        return {
            "status": process_status(
                groups.values(),
                unhealthy="dead" in hint_statuses or any(p["stalled"] for p in pumps),
                degraded="reconnecting" in hint_statuses or bool(queues),
            ),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "groups": groups,
            "pumps": pumps,
            "hints": hints,
            "queues": queues,
        }

    def unserved_queues(self) -> list[UnservedQueue]:
        """The queues of the databases served here that have due jobs and no live pump anywhere
        serving them, as last read (their wait grown by the time since)."""
        now = time.monotonic()
        return [
            UnservedQueue(name, due_for + (now - read_at), alias)
            for alias, (read_at, found) in list(self._unserved.items())
            for name, due_for in found
        ]

    def _check_unserved(self) -> None:
        """Read each database's unserved queues (one statement; best effort: an unreachable
        database leaves its last reading, and its pumps report the fault). A queue that turns
        unserved is logged once, until it is served again: its jobs wait for ever meanwhile."""
        for alias in self.databases:
            try:
                if alias not in self._health_stores:
                    self._health_stores[alias] = self._store_factory(alias)
                found = self._health_stores[alias].unserved_queues()
            except StoreError as error:
                logger.debug("Could not read the unserved queues of %s: %s", alias, error)
                continue
            self._unserved[alias] = (time.monotonic(), found)
            names = {(alias, name) for name, _ in found}
            for name, due_for in found:
                if (alias, name) not in self._unserved_logged:
                    logger.warning(
                        "Queue %r%s is degraded: %s", name, self._on(alias), UnservedQueue(name, due_for, alias).reason
                    )
            self._unserved_logged = {key for key in self._unserved_logged if key[0] != alias} | names

    def _refresh_halted(self) -> None:
        """Keep the health rows of halted pumps fresh while this process lives, so they are not
        forgotten as silent; best effort, one statement for all of them."""
        for alias in self.databases:
            halted = [p.health_row() for p in self.pumps if p.options.database == alias and p.health == HALTED and not p.alive]
            if not halted:
                continue
            try:
                if alias not in self._health_stores:
                    self._health_stores[alias] = self._store_factory(alias)
                self._health_stores[alias].record_pumps_many(pumps=halted)
            except StoreError as error:
                logger.debug("Could not refresh the health of halted pumps on %s: %s", alias, error)

    @property
    def jobs_done(self) -> int:
        return sum(p.snapshot.applied for p in self.pumps)

    @property
    def idle(self) -> bool:
        """No pump has work, and no observer loop found a transition due in its last pass."""
        return all(p.snapshot.idle for p in self.pumps) and all(loop.idle for loop in self.observer_loops)

    def drain(self, timeout: float | None = None) -> None:
        for pump in self.pumps:
            pump.drain(timeout)

    def stop_now(self) -> None:
        for pump in self.pumps:
            pump.stop_now()

    def _enforce_hard_limit(self) -> None:
        """A Python thread cannot be killed: when a handler told to stop has not returned within
        the hard limit, the whole process goes (after a drain: the other jobs finish or are
        given back), and its supervisor starts a fresh one."""
        now = time.monotonic()
        for pump in self.pumps:
            for control in pump.controls.stopped_running():
                if control.stopped_at is not None and now - control.stopped_at >= self.hard_time_limit:
                    logger.critical(
                        "Job %s attempt %s was told to stop (%s) %.1fs ago and its handler still runs: this process drains and "
                        "ends itself (exit %d) for its supervisor to replace it",
                        control.job_id,
                        control.attempt,
                        control.stop_reason,
                        now - control.stopped_at,
                        REPLACE_ME,
                    )
                    self.replacing = True
                    self.drain()
                    return

    def _on_signal(self, signum, frame) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.info("Received %s: draining (a second signal stops at once)", signal.Signals(signum).name)
            self.drain()
        else:
            logger.warning(
                "Received %s again: stopping at once; unfinished jobs run again after their lease lapses",
                signal.Signals(signum).name,
            )
            self.stop_now()
            # Handler threads cannot be interrupted and the interpreter would wait for them at
            # exit: leave now, as the operator asked.
            logging.shutdown()
            os._exit(128 + signum)

    @property
    def stragglers(self) -> int:
        """Handler threads still running for jobs the pumps gave up on (drain deadline passed)."""
        return sum(p.snapshot.abandoned for p in self.pumps)

"""The observer loop: transitions delivered to their observers, at least once, off the pumps.

Theory of operation
-------------------
The statements that apply transitions note the watched ones in ``backwave_transition`` (see
``backwave/observers.py``). One ``ObserverLoop`` per database a worker serves runs on its own
thread with its own store connection, and repeats one pass: claim up to ``batch`` due rows
(``claim_transitions``: SKIP LOCKED, so the loops of every worker share the table, each row
stamped with this pass's token and due again a lease later), call each row's observers one
after another, each call in its own attempt scope (``enter_attempt`` / ``leave_attempt``, as a
job's handler), and record the pass in one statement (``settle_transitions``, fenced by the
token). A pass that found a full batch is followed at once by the next; otherwise the loop waits
``poll_interval``.

Why a plain loop and not a Node Driver of its own: it has one thread and one thing in flight at a
time, no lease to heartbeat (each row's claim is its own lease, set by the claim and spent by the
pass), nothing arriving from other threads but a stop, and one decision, what a failure turns
into, which is pure and lives in ``backwave/core/deliveries.py``.

Whose a delivery is: a row names the observers it was noted for, and a loop claims only rows
waiting for one of its registry's, so a worker of an older release (one observer fewer) leaves
the newer observer's part of a row to a worker that has it (see ``backwave/observers.py``).

At least once, never for a refused outcome: a row exists only for an applied transition. A loop
that dies (or hangs past the lease) mid-pass leaves its rows to come due again; the next claimer
calls the observers that had not been recorded as done, those of the crashed pass included. A
transient store fault is logged and the pass retried after a backoff; a pass whose observers ran
and whose settle failed is redelivered after the lease.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import traceback as traceback_module
import uuid
from collections.abc import Callable, Sequence

from backwave.core.backoff import fault_delay
from backwave.core.deliveries import DeliveryOptions, after_failure
from backwave.observers import ObserverRegistry, Transition
from backwave.store.contract import DeliveryResult, Store, StoreError, TransientStoreError, TransitionRecord
from backwave.store.storable import clean_text, cut_tail

from .scope import enter_attempt, leave_attempt

logger = logging.getLogger("backwave.observers")

MAX_ERROR_CHARS = 16_000
FAULT_BACKOFF_CAP = 30.0  # seconds between tries while the store keeps failing


def deliver(
    records: Sequence[TransitionRecord],
    registry: ObserverRegistry,
    *,
    options: DeliveryOptions,
    jitter: Callable[[], float],
    enter: Callable[[], None] = enter_attempt,
    leave: Callable[[], None] = leave_attempt,
) -> list[DeliveryResult]:
    """Call each claimed transition's observers that have not run for it yet, in name order,
    each in its own scope; stop at a transition's first observer that raises. What happened, per
    transition, for settle_transitions. Never raises for an observer's exception.

    A transition noted for named observers is delivered to those of them ``registry`` has; the
    others are left to a worker that has them (settle_transitions keeps the row for them). One
    registered here whose definition no longer watches it (its filter changed in this release)
    is recorded as delivered without a call."""
    results = []
    for record in records:
        transition = Transition(
            id=record.id,
            job_id=record.job_id,
            attempt=record.attempt,
            kind=record.kind,
            task_path=record.task_path,
            queue=record.queue,
            occurred_at=record.occurred_at,
            delivery=record.deliveries,
        )
        done = set(record.delivered_to)
        delivered: list[str] = []
        failure: tuple[str, str] | None = None
        for observer in _observers_of(record, transition, registry):
            if observer.name in done:
                continue
            if record.observers and not observer.matches(transition.kind, transition.task_path, transition.queue):
                logger.debug(
                    "Observer %s no longer watches transition %s (%s of %s): recorded as delivered",
                    observer.name,
                    record.id,
                    record.kind,
                    record.task_path,
                )
                delivered.append(observer.name)
                continue
            try:
                enter()
                try:
                    observer(transition)
                finally:
                    leave()
            except Exception as error:
                failure = (observer.name, _error_text(error))
                break
            delivered.append(observer.name)
        if failure is None:
            results.append(DeliveryResult(id=record.id, delivered=tuple(delivered)))
            continue
        dead, delay = after_failure(deliveries=record.deliveries, options=options, jitter=jitter())
        name, text = failure
        log = logger.error if dead else logger.warning
        log(
            "Observer %s failed on transition %s (job %s %s, try %d)%s",
            name,
            record.id,
            record.job_id,
            record.kind,
            record.deliveries,
            "; no tries left: the transition is dead (retry it in the admin)" if dead else f"; retried in {delay:.1f} s",
        )
        results.append(
            DeliveryResult(
                id=record.id, delivered=tuple(delivered), failed_observer=name, error=text, retry_delay=delay, dead=dead
            )
        )
    return results


def _observers_of(record: TransitionRecord, transition: Transition, registry: ObserverRegistry) -> list:
    """The observers of ``registry`` the transition is for, in name order: those it was noted
    for that are registered here, or, for a row that names none, those that watch it."""
    if not record.observers:
        return registry.matching(transition)
    return [observer for name in sorted(record.observers) if (observer := registry.get(name)) is not None]


def _error_text(error: BaseException) -> str:
    try:
        text = "".join(traceback_module.format_exception(error))
    except Exception:
        text = f"{type(error).__module__}.{type(error).__qualname__}"
    return cut_tail(clean_text(text), MAX_ERROR_CHARS)


class ObserverLoop:
    """Delivers the transitions of one database to ``registry``'s observers, on its own thread."""

    def __init__(
        self,
        *,
        store_factory: Callable[[], Store],
        registry: ObserverRegistry,
        options: DeliveryOptions,
        name: str = "default",
        enter: Callable[[], None] = enter_attempt,
        leave: Callable[[], None] = leave_attempt,
    ):
        self.options = options
        self.registry = registry
        self.delivered = 0  # transitions settled as fully delivered, since start
        self.failed = 0  # failed tries, since start
        self._store_factory = store_factory
        self._store: Store | None = None
        self._observed = registry.observed
        self._enter, self._leave = enter, leave
        # Recorded by each claim with the observers it takes deliveries for (the Transitions page).
        self.deliverer = f"{socket.gethostname()}:{os.getpid()}:{name}"
        self._random = random.Random()
        self._stop = threading.Event()
        self.idle = False  # the last pass found nothing due (read by the worker's idle check)
        self._thread = threading.Thread(target=self._run, name=f"backwave-observers-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the pass in progress (if any), then leave."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run_once(self) -> int:
        """One pass: claim, deliver, settle. Returns how many transitions it claimed."""
        store = self._connected()
        token = uuid.uuid4()
        records = store.claim_transitions(
            token=token,
            limit=self.options.batch,
            lease=self.options.lease,
            observers=self.registry.names,
            deliverer=self.deliverer,
        )
        self.idle = not records
        if not records:
            return 0
        results = deliver(
            records, self.registry, options=self.options, jitter=self._random.random, enter=self._enter, leave=self._leave
        )
        settled = store.settle_transitions(token=token, results=results)
        self.delivered += sum(1 for r in results if r.failed_observer is None and r.id in settled)
        self.failed += sum(1 for r in results if r.failed_observer is not None)
        if len(settled) < len(results):
            logger.warning(
                "%d of %d transition(s) were claimed again before this pass ended (it took longer than OBSERVER_LEASE, %.0f s): "
                "their observers run again",
                len(results) - len(settled),
                len(results),
                self.options.lease,
            )
        return len(records)

    def _connected(self) -> Store:
        if self._store is None:
            self._store = self._store_factory()
            self._store.observed = self._observed
        return self._store

    def _run(self) -> None:
        streak = 0
        try:
            while not self._stop.is_set():
                try:
                    claimed = self.run_once()
                    streak = 0
                except StoreError as error:
                    # Transient or not (a table not migrated yet), the rows stay where they are:
                    # try again after a backoff rather than leave this database's observers unfed.
                    streak += 1
                    wait = fault_delay(
                        streak=streak, base=self.options.poll_interval, cap=FAULT_BACKOFF_CAP, jitter=self._random.random()
                    )
                    log = logger.warning if isinstance(error, TransientStoreError) else logger.error
                    log("Observer loop: store fault (%s); trying again in %.1f s", error, wait)
                    if not isinstance(error, TransientStoreError) and self._store is not None:
                        self._store.close()  # a fresh connection for the next try
                        self._store = None
                    self._stop.wait(wait)
                    continue
                if claimed < self.options.batch:
                    self._stop.wait(self.options.poll_interval)
        except Exception:
            logger.exception("Observer loop stopped on an unexpected error; transitions wait for another worker")
        finally:
            if self._store is not None:
                try:
                    self._store.close()
                except Exception:
                    logger.debug("Closing the observer loop's store failed", exc_info=True)

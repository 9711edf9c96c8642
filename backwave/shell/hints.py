"""Wake-Up Hints: one LISTEN connection per worker process, shared by its pumps.

An enqueue sends ``NOTIFY backwave_hint, '<queue>'`` inside the enqueuing transaction, so the
hint goes out only on commit (and PostgreSQL folds identical notifications of one transaction
into one, so a bulk enqueue sends one per queue). The listener hands each hint to the pumps that
serve that queue; a pump turns it into a ``HintReceived`` for its driver, which only brings the
next poll forward through the single pending-poll slot. The session itself is the store's
(``backwave.store.hints.HintConnection``): this module speaks no SQL and no psycopg.

Hints are never needed for correctness: while the listener is down (connection lost, server
restarting) it reconnects with backoff, and the pumps fall back to polling every
``poll_interval``. LISTEN needs a session of its own: point it at PostgreSQL directly, not
through a transaction-mode pooler (PgBouncer in transaction mode drops LISTEN state).

Nothing a subscriber raises reaches the listener (it is logged with its traceback, and the other
subscribers still get the hint), and any error of its own (not only the store's) is a lost
connection: logged, ``connected`` cleared, reconnected after a backoff. Should the thread end all
the same (a BaseException), ``health()`` says so, and the worker's health endpoint answers 503:
latency would otherwise fall to ``poll_interval`` with nothing shown.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from backwave.store.contract import StoreError
from backwave.store.hints import CHANNEL, HintConnection

__all__ = ["CANCEL_PREFIX", "CHANNEL", "HintListener"]

# A cancel of a running job rides the hint channel: "cancel:<job id>:<who>" (see cancel_jobs).
CANCEL_PREFIX = "cancel:"

logger = logging.getLogger("backwave.hints")


class HintListener:
    """A daemon thread that LISTENs and fans hints out to subscribers by queue name."""

    def __init__(self, connect_params: Mapping[str, Any], *, max_backoff: float = 5.0, wait_step: float = 0.5):
        self._session = HintConnection(connect_params)
        # Per queue: (callback, the server session whose hints that subscriber does not take).
        self._subscribers: dict[str, list[tuple[Callable[[], None], Callable[[], int | None]]]] = defaultdict(list)
        self._cancel_subscribers: list[Callable[[int, str], None]] = []
        self._stop = threading.Event()
        self._max_backoff = max_backoff
        self._wait_step = wait_step
        self._random = random.Random()
        self.connected = threading.Event()
        self.hints_received = 0
        self.subscriber_failures = 0
        self.last_error = ""  # why the connection was last lost (or the thread ended); kept once reconnected
        self._thread = threading.Thread(target=self._run, name="backwave-hints", daemon=True)

    def subscribe_cancels(self, callback: Callable[[int, str], None]) -> None:
        """Call ``callback(job_id, who)`` (from the listener thread; it must not block) for each
        cancel of a running job (cancel_jobs NOTIFYs ``cancel:<id>:<who>`` on the hint channel)."""
        self._cancel_subscribers.append(callback)

    def subscribe(
        self, queues: Iterable[str], callback: Callable[[], None], *, own_session: Callable[[], int | None] = lambda: None
    ) -> None:
        """Call ``callback`` (from the listener thread; it must not block) on a hint for any of
        ``queues``, but not on one sent by the server session whose process id ``own_session()``
        returns (a pump's own store: what its statements make ready, it claims itself)."""
        for queue in queues:
            self._subscribers[queue].append((callback, own_session))

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def health(self) -> dict:
        """The listener's part of the worker's health: ``listening``, ``reconnecting`` (degraded:
        polling covers), ``dead`` (its thread ended though nobody stopped it: unhealthy), or
        ``stopped`` / ``not started``."""
        if self._thread.ident is None:
            status = "not started"
        elif self._thread.is_alive():
            status = "listening" if self.connected.is_set() else "reconnecting"
        else:
            status = "stopped" if self._stop.is_set() else "dead"
        return {
            "status": status,
            "alive": self._thread.is_alive(),
            "connected": self.connected.is_set(),
            "last_error": self.last_error,
            "hints_received": self.hints_received,
            "subscriber_failures": self.subscriber_failures,
        }

    def stop(self) -> None:
        self._stop.set()
        self._session.cancel()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            self._reconnect_for_ever()
        except BaseException as error:  # not even this may end the thread unseen
            self.connected.clear()
            self.last_error = f"{type(error).__name__}: {error}"
            logger.critical("The wake-up hint listener died; pumps poll every poll_interval from now on", exc_info=error)

    def _reconnect_for_ever(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as error:
                if self.connected.is_set():
                    backoff = 0.1  # it was listening: a new outage backs off from the start
                self.connected.clear()
                # A StoreError's text already names the database error behind it.
                self.last_error = str(error) if isinstance(error, StoreError) else f"{type(error).__name__}: {error}"
                if self._stop.is_set():
                    break
                delay = backoff * (0.5 + self._random.random() / 2)
                if isinstance(error, StoreError):
                    logger.warning(
                        "Wake-up hint listener lost its connection (%s); polling covers until it reconnects in %.1fs",
                        error,
                        delay,
                    )
                else:
                    logger.error(
                        "Wake-up hint listener failed; polling covers until it reconnects in %.1fs", delay, exc_info=error
                    )
                self._stop.wait(delay)
                backoff = min(backoff * 2, self._max_backoff)
            finally:
                self._session.close()

    def _listen(self) -> None:
        self._session.open()
        self.connected.set()
        logger.debug("Listening for wake-up hints on %s", CHANNEL)
        while not self._stop.is_set():
            # A bounded wait, so stop() is noticed even when no hint ever comes.
            for queue, sender in self._session.notifies(timeout=self._wait_step):
                self.hints_received += 1
                if queue.startswith(CANCEL_PREFIX):
                    self._deliver_cancel(queue)
                    continue
                for callback, own_session in self._subscribers.get(queue, ()):
                    if sender != own_session():
                        self._deliver(callback, queue)

    def _deliver_cancel(self, payload: str) -> None:
        _prefix, job_id, who = (payload.split(":", 2) + ["", ""])[:3]
        if not job_id.isdigit():
            logger.warning("Ignored a malformed cancel notification %r", payload[:200])
            return
        for callback in self._cancel_subscribers:
            self._deliver(lambda: callback(int(job_id), who), f"cancel of job {job_id}")

    def _deliver(self, callback: Callable[[], None], queue: str) -> None:
        try:
            callback()
        except BaseException:  # a subscriber's bug is its own: the others still get their hints
            self.subscriber_failures += 1
            logger.error("A wake-up hint subscriber failed on a hint for queue %r; the listener carries on", queue, exc_info=True)

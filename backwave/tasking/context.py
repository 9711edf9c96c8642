"""``JobContext``: the ``TaskContext`` a BackWave handler gets (``@task(takes_context=True)``).

Django's TaskContext plus what a running attempt may ask and tell its worker:

* ``should_stop()``, ``deadline``, ``time_left()``, ``cancelled``, ``raise_if_stopping()``: a
  Python thread cannot be stopped from outside, so a long handler checks these between steps
  (its time limit passed, or someone cancelled the job). With ``--processes`` and
  ``--hard-time-limits`` a handler that never checks is ended with its process.
* ``set_progress(value)`` and ``metadata`` (with ``save_metadata()``): small JSON values the
  worker writes with its next heartbeat (never a statement per call) and with the attempt's
  outcome, readable through ``get_result()`` (``result.progress``, ``result.metadata``) and shown
  in the admin while the job runs. Each is checked here, in the handler's thread, so a value
  PostgreSQL cannot store fails where it is set, never a heartbeat or another job.

``AttemptControl`` is the worker's side of one attempt: the handler thread writes it through the
context, the pump thread reads what to report and sets the stop flag.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.tasks import TaskContext

from ..store.contract import ProgressReport
from ..store.storable import encode_result
from .control import Cancelled, TimeLimitExceeded

# What one set_progress() or the metadata may hold, encoded: a heartbeat carries every running
# attempt's, so each stays small. Larger data belongs in the return value.
MAX_PROGRESS_BYTES = 8 * 1024


class AttemptControl:
    """One running attempt's stop flag, deadline and unreported progress (thread-safe)."""

    def __init__(self, *, job_id: int, attempt: int, timeout: float | None, clock=time.monotonic):
        self.job_id = job_id
        self.attempt = attempt
        self._clock = clock
        self.started = clock()
        self.deadline = None if timeout is None else self.started + timeout  # on ``clock``
        # Set once by the pump thread, read by the handler's: a plain attribute (one store, one
        # load under the GIL) instead of a threading.Event, as one is built per attempt.
        self.stop_reason = ""
        self.stopped_at: float | None = None  # on ``clock``: when stop() was first called
        self._lock = threading.Lock()
        self._progress: Any = None  # set since the last report
        self._metadata: Any = None
        self.last_progress: Any = None  # for the outcome: the attempt's last values
        self.last_metadata: Any = None

    # -- the pump's side ------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Make should_stop() true (a timeout or a cancel; the first reason stays)."""
        with self._lock:
            if not self.stop_reason:
                self.stopped_at = self._clock()
                self.stop_reason = reason or "stopped"

    def take_report(self) -> ProgressReport | None:
        """What was set since the last call, or None."""
        with self._lock:
            if self._progress is None and self._metadata is None:
                return None
            report = ProgressReport(job_id=self.job_id, attempt=self.attempt, progress=self._progress, metadata=self._metadata)
            self._progress = self._metadata = None
            return report

    # -- the handler's side ---------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self.stop_reason.startswith("cancelled")

    def should_stop(self) -> bool:
        return bool(self.stop_reason) or (self.deadline is not None and self._clock() >= self.deadline)

    def time_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - self._clock())

    def set_progress(self, value: Any) -> None:
        stored = _storable(value, "set_progress()")
        with self._lock:
            self._progress = self.last_progress = stored

    def save_metadata(self, metadata: dict) -> None:
        stored = _storable(metadata, "context.metadata")
        with self._lock:
            self._metadata = self.last_metadata = stored


def _storable(value: Any, what: str) -> Any:
    """``value`` as it will be stored (its JSON round trip), or ValueError saying why it cannot."""
    try:
        return json.loads(encode_result(value, max_bytes=MAX_PROGRESS_BYTES))
    except Exception as error:  # UnstorableResult, with what is wrong and where
        raise ValueError(f"{what}: {error}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    """The context of one BackWave attempt (see the module docstring)."""

    control: AttemptControl = field(repr=False, compare=False)
    metadata: dict = field(default_factory=dict, compare=False)

    @property
    def job_id(self) -> int:
        return int(self.task_result.id)

    @property
    def cancelled(self) -> bool:
        """Whether someone cancelled the job while this attempt runs."""
        return self.control.cancelled

    @property
    def deadline(self) -> datetime | None:
        """When this attempt's time limit ends (UTC), or None without one."""
        left = self.control.time_left()
        return None if left is None else datetime.now(UTC) + timedelta(seconds=left)

    def time_left(self) -> float | None:
        """Seconds left of the time limit (0 once past it), or None without one."""
        return self.control.time_left()

    def should_stop(self) -> bool:
        """True once the handler should return: its time limit passed, the job was cancelled,
        or the worker ended the attempt. Cheap: call it between steps of a long loop."""
        return self.control.should_stop()

    def raise_if_stopping(self) -> None:
        """Raise ``backwave.Cancelled`` or ``backwave.TimeLimitExceeded`` when should_stop()."""
        if not self.control.should_stop():
            return
        if self.control.cancelled:
            raise Cancelled(self.control.stop_reason)
        raise TimeLimitExceeded("the attempt ran past its time limit")

    def set_progress(self, value: Any) -> None:
        """Record progress (any small JSON value, e.g. ``{"done": 3, "of": 10}``); written with
        the next heartbeat and the outcome. ValueError for a value that cannot be stored."""
        self.control.set_progress(value)

    def save_metadata(self) -> None:
        """Send ``metadata`` with the next heartbeat (it is also saved with the outcome)."""
        self.control.save_metadata(self.metadata)

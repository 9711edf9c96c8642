"""``JobContext``: the ``TaskContext`` a BackWave handler gets (``@task(takes_context=True)``).

Django's TaskContext (the attempt's ``task_result``, ``attempt``) plus BackWave's side of a job:

* ``job_id``, Job Output (``output()``), runtime tags (``tag()`` / ``untag()``) and its ancestors'
  output (``ancestors``, ``ancestor_output()``). What a handler records is only buffered here: it
  rides the attempt's outcome into the batched outcome write (no statement per call), and the
  worker reads it back after the handler returned *or raised*, so it is kept either way. Once
  the attempt is over the context refuses more.
* ``should_stop()``, ``deadline``, ``time_left()``, ``cancelled``, ``raise_if_stopping()``: a
  Python thread cannot be stopped from outside, so a long handler checks these between steps
  (its time limit passed, or someone cancelled the job). With ``--processes`` and
  ``--hard-time-limits`` a handler that never checks is ended with its process.
* ``set_progress(value)`` and ``metadata`` (with ``save_metadata()``): small JSON values the
  worker writes with its next heartbeat (never a statement per call) and with the attempt's
  outcome, readable through ``get_result()`` (``result.progress``, ``result.metadata``) and shown
  in the admin while the job runs.

Every value is checked as it is recorded, in the handler's thread: a value PostgreSQL cannot
store raises there, in the handler, and can never reach a batch, a heartbeat or another job.

``AttemptControl`` is the worker's side of one attempt: the handler thread writes it through the
context, the pump thread reads what to report and sets the stop flag.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.tasks import TaskContext

from ..store.contract import ProgressReport
from ..store.storable import UnstorableResult, encode_result, text_problem
from .control import Cancelled, TimeLimitExceeded
from .task import MAX_TAG_LENGTH, MAX_TAGS

MAX_OUTPUT_NAME_LENGTH = 200
_MISSING = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class Ancestor:
    """A job this one waited for, as it is when read: its id, task, state and Job Output."""

    job_id: int
    task_path: str
    state: str
    output: dict[str, Any]


# What one set_progress() or the metadata may hold, encoded: a heartbeat carries every running
# attempt's, so each stays small. Larger data belongs in the return value.
MAX_PROGRESS_BYTES = 8 * 1024


class AttemptControl:
    """One running attempt's stop flag, deadline and unreported progress (thread-safe)."""

    # One is built per attempt, on the pump's thread.
    __slots__ = (
        "job_id",
        "attempt",
        "_clock",
        "started",
        "deadline",
        "stop_reason",
        "stopped_at",
        "_lock",
        "_progress",
        "_metadata",
        "last_progress",
        "last_metadata",
        "started_as",
    )

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
        # Set by the handler's thread as its attempt starts: (TaskResult, sender, queue, task
        # path), so that an attempt the driver ends (a time limit), whose handler has not
        # reported, still gets its task_finished once that outcome is written.
        self.started_as: tuple | None = None

    # -- the pump's side ------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds since the attempt was handed to its thread."""
        return self._clock() - self.started

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

    job_id: int
    max_output_bytes: int
    # Reads the ancestors of a job (one query); the worker passes one bound to the job's database.
    resolver: Callable[[int], list[Ancestor]] = field(repr=False, compare=False)
    # The attempt's stop flag, deadline and progress; the worker passes the one its pump thread
    # registered. None (a context built outside a worker): one without a time limit.
    control: AttemptControl = field(default=None, repr=False, compare=False)
    metadata: dict = field(default_factory=dict, compare=False)
    _buffer: dict[str, Any] = field(
        default_factory=lambda: {"output": {}, "sizes": {}, "added": {}, "removed": {}, "ancestors": None, "over": False},
        repr=False,
        compare=False,
    )

    def output(self, name: str, value: Any) -> None:
        """Record ``value`` (JSON) under ``name`` in this job's Job Output; a name recorded again
        replaces the value. The whole output is capped at BACKWAVE["MAX_RESULT_BYTES"] of JSON;
        a value PostgreSQL cannot store, or one past the cap, raises UnstorableResult here."""
        self._open()
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_OUTPUT_NAME_LENGTH or text_problem(name):
            raise ValueError(
                f"an output name is a string of 1 to {MAX_OUTPUT_NAME_LENGTH} characters without NUL or lone surrogates, got {name!r:.100}"
            )
        buffer = self._buffer
        try:
            text = encode_result(value, max_bytes=self.max_output_bytes)
        except UnstorableResult as error:
            raise UnstorableResult(str(error).replace("the return value", f"output {name!r}", 1)) from None
        size = len(json.dumps(name)) + len(text) + 2
        total = sum(buffer["sizes"].values()) - buffer["sizes"].get(name, 0) + size
        if total > self.max_output_bytes:
            raise UnstorableResult(
                f"output {name!r} would bring this attempt's Job Output to {total:,} bytes of JSON, over "
                f"BACKWAVE['MAX_RESULT_BYTES'] ({self.max_output_bytes:,}); store large data elsewhere and record its id"
            )
        buffer["output"][name] = json.loads(text)  # as it will be stored, frozen now
        buffer["sizes"][name] = size

    def tag(self, *tags: str) -> None:
        """Add tags to the job (kept with its enqueue tags, each once)."""
        self._open()
        added, removed = self._buffer["added"], self._buffer["removed"]
        for tag in tags:
            _check_tag(tag)
            removed.pop(tag, None)
            added[tag] = None
        if len(added) > MAX_TAGS:
            raise ValueError(f"an attempt may add at most {MAX_TAGS} tags, got {len(added)}")

    def untag(self, *tags: str) -> None:
        """Remove tags from the job (enqueue tags too)."""
        self._open()
        added, removed = self._buffer["added"], self._buffer["removed"]
        for tag in tags:
            _check_tag(tag)
            added.pop(tag, None)
            removed[tag] = None
        if len(removed) > 4 * MAX_TAGS:
            raise ValueError(f"an attempt may remove at most {4 * MAX_TAGS} tags, got {len(removed)}")

    @property
    def ancestors(self) -> tuple[Ancestor, ...]:
        """The jobs this one waited for, in the order its ``after`` named them, with their Job
        Output: read with one query on first use, then kept for the attempt. Not from async
        code: use ``await context.aancestors()``."""
        if self._buffer["ancestors"] is None:
            self._buffer["ancestors"] = tuple(self.resolver(self.job_id))
        return self._buffer["ancestors"]

    async def aancestors(self) -> tuple[Ancestor, ...]:
        """See ``ancestors``."""
        return await sync_to_async(lambda: self.ancestors, thread_sensitive=True)()

    def ancestor_output(self, name: str, default: Any = _MISSING) -> Any:
        """The value of output ``name`` that an ancestor recorded: ``default`` (or KeyError) when
        none did, ValueError when several did (read ``ancestors`` then)."""
        found = [(a.job_id, a.output[name]) for a in self.ancestors if name in (a.output or {})]
        if len(found) > 1:
            raise ValueError(
                f"ancestors {[job_id for job_id, _ in found]} all recorded output {name!r}; read context.ancestors to choose"
            )
        if found:
            return found[0][1]
        if default is _MISSING:
            raise KeyError(f"no ancestor of job {self.job_id} recorded output {name!r}")
        return default

    # -- attempt control ------------------------------------------------------------------------

    def __post_init__(self):
        if self.control is None:
            object.__setattr__(self, "control", AttemptControl(job_id=self.job_id, attempt=self.attempt, timeout=None))

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

    # -- the worker's side ------------------------------------------------------------------------

    def close(self) -> tuple[dict[str, Any] | None, tuple[str, ...], tuple[str, ...]]:
        """End the attempt: what it recorded (output, tags added, tags removed); later calls raise."""
        buffer = self._buffer
        buffer["over"] = True
        return (dict(buffer["output"]) or None, tuple(buffer["added"]), tuple(buffer["removed"]))

    def _open(self) -> None:
        if self._buffer["over"]:
            raise RuntimeError(f"the attempt of job {self.job_id} is over; its context records nothing more")


def _check_tag(tag: Any) -> None:
    if not isinstance(tag, str) or not 1 <= len(tag) <= MAX_TAG_LENGTH or text_problem(tag):
        raise ValueError(
            f"a tag is a string of 1 to {MAX_TAG_LENGTH} characters without NUL or lone surrogates, got {tag!r:.100}"
        )


def database_resolver(database: str) -> Callable[[int], list[Ancestor]]:
    """A resolver reading ancestors on Django's connection to ``database`` (the handler thread's)."""

    def resolve(job_id: int) -> list[Ancestor]:
        from django.db import connections

        from ..store.operator import ancestor_outputs

        with connections[database].cursor() as cursor:
            rows = ancestor_outputs(cursor, job_id)
        return [Ancestor(job_id=row[0], task_path=row[1], state=row[2], output=_decoded(row[3])) for row in rows]

    return resolve


def _decoded(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    return json.loads(value) if isinstance(value, str) else value

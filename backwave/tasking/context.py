"""JobContext: what a task declared with ``@task(takes_context=True)`` gets as its first argument.

Django's ``TaskContext`` (the attempt's ``task_result``, ``attempt``) plus BackWave's side of a
job: its id, Job Output (``output``), runtime tags (``tag`` / ``untag``) and its ancestors' output
(``ancestors``, ``ancestor_output``). What a handler records is only buffered here: it rides the
attempt's outcome into the batched outcome write (no statement per call), and the worker reads
it back after the handler returned *or raised*, so it is kept either way. Every value is checked
as it is recorded, inside the attempt: a value PostgreSQL cannot store raises there, in the
handler, and can never reach a batch. Once the attempt is over the context refuses more.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.tasks import TaskContext

from ..store.storable import UnstorableResult, encode_result, text_problem
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


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    """The context of one attempt of a BackWave job."""

    job_id: int
    max_output_bytes: int
    # Reads the ancestors of a job (one query); the worker passes one bound to the job's database.
    resolver: Callable[[int], list[Ancestor]] = field(repr=False, compare=False)
    _buffer: dict[str, Any] = field(default_factory=lambda: {"output": {}, "sizes": {}, "added": {}, "removed": {}, "ancestors": None, "over": False}, repr=False, compare=False)

    def output(self, name: str, value: Any) -> None:
        """Record ``value`` (JSON) under ``name`` in this job's Job Output; a name recorded again
        replaces the value. The whole output is capped at BACKWAVE["MAX_RESULT_BYTES"] of JSON;
        a value PostgreSQL cannot store, or one past the cap, raises UnstorableResult here."""
        self._open()
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_OUTPUT_NAME_LENGTH or text_problem(name):
            raise ValueError(f"an output name is a string of 1 to {MAX_OUTPUT_NAME_LENGTH} characters without NUL or lone surrogates, got {name!r:.100}")
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
            raise ValueError(f"ancestors {[job_id for job_id, _ in found]} all recorded output {name!r}; read context.ancestors to choose")
        if found:
            return found[0][1]
        if default is _MISSING:
            raise KeyError(f"no ancestor of job {self.job_id} recorded output {name!r}")
        return default

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
        raise ValueError(f"a tag is a string of 1 to {MAX_TAG_LENGTH} characters without NUL or lone surrogates, got {tag!r:.100}")


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

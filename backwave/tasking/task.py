"""The task side of BackWave's ``django.tasks`` integration.

* ``BackWaveTask``: Django's ``Task`` plus BackWave's per-task options (``max_attempts``,
  ``backoff_base``, ``backoff_max``, ``tags``), so ``@task(max_attempts=5)`` and
  ``.using(max_attempts=5)`` work. ``None`` means "the backend's default" (``backwave.conf``).
* Small pure validators: each raises ``InvalidTask`` naming the option, the value and what is
  allowed, before anything is written.
* The payload codec is in ``payload.py``.
* ``enqueue_many``: many calls, one INSERT.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.tasks import Task, TaskResult
from django.tasks.exceptions import InvalidTask

from ..queue_rules import QUEUE_NAME_RULE, is_queue_name

MAX_TASK_PATH_LENGTH = 255  # Job.task_path
MAX_TAGS = 16
MAX_TAG_LENGTH = 64  # Job.tags is varchar(64)[]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackWaveTask(Task):
    """A ``django.tasks.Task`` with BackWave's retry options and tags."""

    max_attempts: int | None = None  # None: DEFAULT_MAX_ATTEMPTS
    backoff_base: float | None = None  # None: DEFAULT_BACKOFF_BASE
    backoff_max: float | None = None  # None: DEFAULT_BACKOFF_MAX
    tags: tuple[str, ...] = ()
    # Attempt control (see README "Attempt control"). timeout: seconds one attempt may run (None:
    # no limit), also per enqueue through .using(timeout=...). retry_on: only these exceptions
    # are retried (empty: all); discard_on: these fail the job at once. backoff(attempt, exc):
    # seconds (or a timedelta) before the next attempt, None for no more; as Django's proposed
    # retry API, .using() cannot change retry_on, discard_on or backoff.
    timeout: float | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    discard_on: tuple[type[BaseException], ...] = ()
    backoff: Callable[[int, BaseException], float | timedelta | None] | None = None

    def __post_init__(self):
        for name in ("tags", "retry_on", "discard_on"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
            elif name != "tags" and isinstance(getattr(self, name), type):
                object.__setattr__(self, name, (getattr(self, name),))  # retry_on=ValueError
        # Not super(): a slots dataclass is a new class, so the zero-argument form breaks before 3.14.
        Task.__post_init__(self)

    def using(
        self,
        *,
        priority=None,
        queue_name=None,
        run_after=None,
        backend=None,
        max_attempts=None,
        backoff_base=None,
        backoff_max=None,
        tags=None,
        timeout=None,
    ):
        """A copy of the task with other defaults: Django's options plus BackWave's."""
        options = {
            "priority": priority,
            "queue_name": queue_name,
            "run_after": run_after,
            "backend": backend,
            "max_attempts": max_attempts,
            "backoff_base": backoff_base,
            "backoff_max": backoff_max,
            "tags": tags,
            "timeout": timeout,
        }
        return replace(self, **{name: value for name, value in options.items() if value is not None})


class TaskCall(NamedTuple):
    """One call for ``enqueue_many``: a task and its arguments."""

    task: Task
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = MappingProxyType({})


# --- validators -------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def validate_django_options(task, *, queues: Iterable[str], alias: str) -> None:
    """Check the options Django's base backend checks too, first, with messages that name the value
    (and without the TypeError a string priority or a timedelta run_after would raise there)."""
    path = task.module_path
    priority = task.priority
    if not (_is_int(priority) or (isinstance(priority, float) and priority.is_integer())) or not -100 <= priority <= 100:
        raise InvalidTask(f"priority of task {path!r} must be an integer from -100 to 100 (higher runs first), got {priority!r}.")
    if task.run_after is not None and not isinstance(task.run_after, datetime):
        raise InvalidTask(
            f"run_after of task {path!r} must be a datetime, got {task.run_after!r}; "
            "for a delay use .using(run_after=timezone.now() + timedelta(...))."
        )
    queue = task.queue_name
    if not is_queue_name(queue):
        raise InvalidTask(f"queue_name of task {path!r} must be {QUEUE_NAME_RULE}, got {queue!r}.")
    queues = sorted(queues, key=str)
    if queues and queue not in queues:
        from difflib import get_close_matches

        close = get_close_matches(queue, queues, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidTask(
            f"queue_name {queue!r} of task {path!r} is not one of backend {alias!r}'s QUEUES {queues}.{hint}"
        )
    if len(path) > MAX_TASK_PATH_LENGTH:
        raise InvalidTask(f"task path {path!r} is {len(path)} characters long; the limit is {MAX_TASK_PATH_LENGTH}.")


def validate_backwave_options(task) -> None:
    """Check ``max_attempts``, ``backoff_base``, ``backoff_max`` and ``tags`` (a plain ``Task``
    has none of them and passes)."""
    path = task.module_path
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and (not _is_int(max_attempts) or max_attempts < 1):
        raise InvalidTask(f"max_attempts of task {path!r} must be an integer >= 1 (or None for the default), got {max_attempts!r}.")
    for name in ("backoff_base", "backoff_max"):
        value = getattr(task, name, None)
        if value is not None and not _is_seconds(value):
            raise InvalidTask(f"{name} of task {path!r} must be a finite number of seconds >= 0 (or None for the default), got {value!r}.")
    validate_control_options(task)
    tags = getattr(task, "tags", ())
    if isinstance(tags, str) or not isinstance(tags, tuple):
        raise InvalidTask(f"tags of task {path!r} must be a list or tuple of strings, got {tags!r}" + (f"; did you mean ({tags!r},)?" if isinstance(tags, str) else "."))
    if len(tags) > MAX_TAGS:
        raise InvalidTask(f"task {path!r} has {len(tags)} tags; at most {MAX_TAGS} are allowed.")
    for tag in tags:
        if not isinstance(tag, str) or not 1 <= len(tag) <= MAX_TAG_LENGTH or "\x00" in tag:
            raise InvalidTask(f"each tag of task {path!r} must be a string of 1 to {MAX_TAG_LENGTH} characters, got {tag!r}.")


MAX_TIMEOUT = 7 * 86_400.0  # a week, as for worker intervals: longer is a unit mistake


def validate_control_options(task) -> None:
    """Check ``timeout``, ``retry_on``, ``discard_on`` and ``backoff``."""
    path = task.module_path
    timeout = getattr(task, "timeout", None)
    if timeout is not None and not (_is_seconds(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise InvalidTask(f"timeout of task {path!r} must be a number of seconds above 0 and at most {MAX_TIMEOUT:,.0f} (a week), or None for no limit, got {timeout!r}.")
    for name in ("retry_on", "discard_on"):
        kinds = getattr(task, name, ())
        if not isinstance(kinds, tuple) or not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in kinds):
            raise InvalidTask(f"{name} of task {path!r} must be an exception class or a tuple of them, got {kinds!r}.")
    backoff = getattr(task, "backoff", None)
    if backoff is not None and not callable(backoff):
        raise InvalidTask(f"backoff of task {path!r} must be a callable backoff(attempt, exception) returning seconds or None, got {backoff!r}.")


# --- many at once -----------------------------------------------------------------------------


def coerce_calls(calls: Iterable[TaskCall | tuple]) -> list[TaskCall]:
    """``calls`` as TaskCalls, or InvalidTask naming the first one that is not ``(task, args, kwargs)``."""
    coerced = []
    for position, call in enumerate(calls):
        if not isinstance(call, tuple) or not 1 <= len(call) <= 3 or not isinstance(call[0], Task):
            raise InvalidTask(f"enqueue_many: call #{position} must be a (task, args, kwargs) tuple whose task is a django.tasks.Task (a function decorated with @task), got {call!r:.200}.")
        coerced.append(TaskCall(*call))
    return coerced


def enqueue_many(calls: Iterable[TaskCall | tuple]) -> list[TaskResult]:
    """Enqueue ``(task, args, kwargs)`` calls with one INSERT; all must use the same backend.
    Everything is validated before anything is written. Results come back in input order."""
    from django.tasks import task_backends

    calls = coerce_calls(calls)
    if not calls:
        return []
    aliases = sorted({call.task.backend for call in calls})
    if len(aliases) != 1:
        raise InvalidTask(f"enqueue_many writes one statement on one backend, but the tasks use backends {aliases}; call it once per backend.")
    backend = task_backends[aliases[0]]
    if not hasattr(backend, "enqueue_many"):
        raise InvalidTask(f"Backend {aliases[0]!r} ({type(backend).__name__}) cannot enqueue many tasks in one statement.")
    return backend.enqueue_many(calls)


async def aenqueue_many(calls: Iterable[TaskCall | tuple]) -> list[TaskResult]:
    """See enqueue_many()."""
    return await sync_to_async(enqueue_many, thread_sensitive=True)(list(calls))

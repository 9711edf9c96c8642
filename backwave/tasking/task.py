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

import functools
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from inspect import iscoroutinefunction
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Self, TypedDict, Unpack, overload

from asgiref.sync import sync_to_async
from django.tasks import Task, TaskResult
from django.tasks.exceptions import InvalidTask

from ..core.backoff import MAX_DELAY
from ..queue_rules import QUEUE_NAME_RULE, is_queue_name

if TYPE_CHECKING:
    from .results import BackWaveTaskResult

MAX_TASK_PATH_LENGTH = 255  # Job.task_path
MAX_JOB_ID = 2**63 - 1  # bigint
MAX_TAGS = 16
MAX_TAG_LENGTH = 64  # Job.tags is varchar(64)[]
MAX_KEY_LENGTH = 200  # a uniqueness key before the task path and period are put around it
MAX_LIMIT_KEY_LENGTH = 255  # Job.limit_key
# A uniqueness window's number (the epoch over the period) is a bigint in the key: a period far
# below a millisecond overflows it (1e-10 s did, aborting the caller's transaction), and one of
# more than a century is a unit mistake (None is "no period").
MIN_UNIQUE_PERIOD = 0.001
MAX_UNIQUE_PERIOD = 100 * 366 * 86_400.0
UNIQUE_STATES = ("ready", "running", "succeeded", "failed", "cancelled", "quarantined")
UNIQUE_FINISHED_STATES = ("succeeded", "failed", "cancelled", "quarantined")
UNIQUE_REPLACEABLE = ("args", "run_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unique:
    """A task's (or one enqueue's) uniqueness: while a job of the same task and key is in one of
    ``states``, enqueuing another returns that job instead (``TaskResult.duplicate`` is True).

    ``by``: the arguments the key is made of, by parameter name (however the call passes them;
    None: all of them); ``key``: an explicit key instead. ``period`` (seconds): the key holds per
    window of that length on the database clock (None: for as long as the job is covered).
    ``states``: what the uniqueness covers; ``ready`` always (a job waiting, due or scheduled),
    ``running`` for "at most one in flight" (the default), finished states to refuse repeats
    within the period (only beside ``running``: a job gets there by running). ``replace``: what a duplicate changes on the job it finds while that one
    is still ready: ``args`` (its arguments) and/or ``run_at`` (pushed to the later run time).
    """

    by: tuple[str, ...] | None = None
    key: str | None = None
    period: float | None = None
    states: tuple[str, ...] = ("ready", "running")
    replace: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("by", "states", "replace"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @classmethod
    def debounce(cls, *, by: tuple[str, ...] | None = None, key: str | None = None, period: float | None = None) -> Unique:
        """Only waiting jobs are covered, and a duplicate replaces the arguments and pushes the
        run time: enqueue with ``run_after`` a delay ahead, and the job runs once, that delay
        after the last enqueue, with the last arguments."""
        return cls(by=by, key=key, period=period, states=("ready",), replace=("args", "run_at"))


@dataclass(frozen=True, slots=True, kw_only=True)
class BackWaveTask(Task):
    """A ``django.tasks.Task`` with BackWave's retry options, tags and admission options."""

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
    # Effect-once for database work: the handler runs inside a transaction on the job's database,
    # and its success is written, fenced by the lease, in that same transaction (README, "Atomic
    # tasks"). Sync tasks only.
    atomic: bool = False
    unique: Unique | None = None
    # The key of the queue's per-key concurrency limit: the value of the argument named
    # ``limit_by``, or ``limit_key`` itself (usually given per enqueue with using()).
    limit_by: str | None = None
    limit_key: str | None = None

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
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        backoff_base: float | None = None,
        backoff_max: float | None = None,
        tags: Sequence[str] | None = None,
        timeout: float | None = None,
        atomic: bool | None = None,
        unique: Unique | None = None,
        limit_by: str | None = None,
        limit_key: str | None = None,
    ) -> Self:
        """A copy of the task with other defaults: Django's options plus BackWave's."""
        if atomic is not None:
            raise InvalidTask(
                f"atomic of task {self.module_path!r} cannot be set with .using(): the worker runs the task registered under "
                "that name, so declare it where the task is defined, @task(atomic=True)."
            )
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
            "unique": unique,
            "limit_by": limit_by,
            "limit_key": limit_key,
        }
        return replace(self, **{name: value for name, value in options.items() if value is not None})

    def enqueue(self, *args: Any, after: Iterable[Any] | None = None, **kwargs: Any) -> BackWaveTaskResult:
        """Django's enqueue; with ``after=[...]`` (TaskResults, job ids, or
        ``backwave.Dependency(result, on_failure=...)``) the job waits until every one of those
        has succeeded. ``after`` is BackWave's: a task argument of that name goes positionally."""
        if after is None:
            return Task.enqueue(self, *args, **kwargs)
        from .workflow import Workflow

        flow = Workflow()
        flow.add(self, args, kwargs, after=after)
        return flow.enqueue()[0]

    async def aenqueue(self, *args: Any, after: Iterable[Any] | None = None, **kwargs: Any) -> BackWaveTaskResult:
        """See enqueue()."""
        if after is None:
            return await Task.aenqueue(self, *args, **kwargs)
        return await sync_to_async(self.enqueue, thread_sensitive=True)(*args, after=after, **kwargs)


class TaskOptions(TypedDict, total=False):
    """The options ``backwave.task`` takes: Django's (``priority``, ``queue_name``, ``backend``,
    ``takes_context``), then BackWave's, each as ``BackWaveTask`` holds it (docs: "Tasks and
    results", "Job control", "Admission limits", "Atomic tasks")."""

    priority: int
    queue_name: str
    backend: str
    takes_context: bool
    max_attempts: int | None
    backoff_base: float | None
    backoff_max: float | None
    tags: Sequence[str]
    timeout: float | None
    retry_on: type[BaseException] | Sequence[type[BaseException]]
    discard_on: type[BaseException] | Sequence[type[BaseException]]
    backoff: Callable[[int, BaseException], float | timedelta | None] | None
    atomic: bool
    unique: Unique | None
    limit_by: str | None
    limit_key: str | None


@overload
def task(function: Callable[..., Any], /, **options: Unpack[TaskOptions]) -> BackWaveTask: ...
@overload
def task(function: None = None, /, **options: Unpack[TaskOptions]) -> Callable[[Callable[..., Any]], BackWaveTask]: ...
def task(
    function: Callable[..., Any] | None = None, /, **options: Unpack[TaskOptions]
) -> BackWaveTask | Callable[[Callable[..., Any]], BackWaveTask]:
    """Django's ``@task`` (``django.tasks.task``), with BackWave's options in its signature so
    that editors and type checkers know them: ``@backwave.task(queue_name="emails",
    max_attempts=5)`` makes the same task as Django's decorator given the same options."""
    from django.tasks import task as django_task

    return django_task(function, **options)


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
    (and without the TypeError a string priority or a timedelta run_after would raise there). Each
    message opens with Django's own sentence, which code written against Django's backends matches."""
    path = task.module_path
    priority = task.priority
    if not (_is_int(priority) or (isinstance(priority, float) and priority.is_integer())) or not -100 <= priority <= 100:
        raise InvalidTask(
            f"priority must be a whole number between -100 and 100. Task {path!r} has priority {priority!r} (higher runs first)."
        )
    if task.run_after is not None and not isinstance(task.run_after, datetime):
        raise InvalidTask(
            f"run_after of task {path!r} must be a datetime, got {task.run_after!r}; "
            "for a delay use .using(run_after=timezone.now() + timedelta(...))."
        )
    queue = task.queue_name
    if not is_queue_name(queue):
        raise InvalidTask(
            f"Queue {queue!r} is not valid for backend. The queue_name of task {path!r} must be {QUEUE_NAME_RULE}, got {queue!r}."
        )
    queues = sorted(queues, key=str)
    if queues and queue not in queues:
        from difflib import get_close_matches

        close = get_close_matches(queue, queues, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidTask(
            f"Queue {queue!r} is not valid for backend. The queue_name of task {path!r} is not one of backend {alias!r}'s QUEUES {queues}.{hint}"
        )
    if len(path) > MAX_TASK_PATH_LENGTH:
        raise InvalidTask(f"task path {path!r} is {len(path)} characters long; the limit is {MAX_TASK_PATH_LENGTH}.")


def validate_backwave_options(task) -> None:
    """Check ``max_attempts``, ``backoff_base``, ``backoff_max`` and ``tags`` (a plain ``Task``
    has none of them and passes)."""
    path = task.module_path
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and (not _is_int(max_attempts) or max_attempts < 1):
        raise InvalidTask(
            f"max_attempts of task {path!r} must be an integer >= 1 (or None for the default), got {max_attempts!r}."
        )
    for name in ("backoff_base", "backoff_max"):
        value = getattr(task, name, None)
        if value is not None and not (_is_seconds(value) and value <= MAX_DELAY):
            raise InvalidTask(
                f"{name} of task {path!r} must be a finite number of seconds >= 0 and at most {MAX_DELAY:,.0f} (a year), or None for the default, got {value!r}."
            )
    validate_control_options(task)
    atomic = getattr(task, "atomic", False)
    if not isinstance(atomic, bool):
        raise InvalidTask(f"atomic of task {path!r} must be True or False, got {atomic!r}.")
    if atomic and iscoroutinefunction(task.func):
        raise InvalidTask(
            f"task {path!r} is an async def and cannot be atomic: its transaction would have to span awaits on one "
            "connection, which Django's atomic() does not do; make it a plain def, or leave atomic off."
        )
    tags = getattr(task, "tags", ())
    if isinstance(tags, str) or not isinstance(tags, tuple):
        raise InvalidTask(
            f"tags of task {path!r} must be a list or tuple of strings, got {tags!r}"
            + (f"; did you mean ({tags!r},)?" if isinstance(tags, str) else ".")
        )
    if len(tags) > MAX_TAGS:
        raise InvalidTask(f"task {path!r} has {len(tags)} tags; at most {MAX_TAGS} are allowed.")
    for tag in tags:
        if not _is_key_text(tag, MAX_TAG_LENGTH):
            raise InvalidTask(
                f"each tag of task {path!r} must be a string of 1 to {MAX_TAG_LENGTH} characters without a NUL or a lone surrogate, got {tag!r}."
            )
    _validate_unique(task)
    _validate_limit_key(task)


def _parameters(task) -> list[str] | None:
    """The names a call's arguments bind to, or None when the task takes **kwargs (any name goes)."""
    parameters = _call_signature(task).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _check_argument_names(task, option: str, names: Sequence[str]) -> None:
    known = _parameters(task)
    context = _context_parameter(task)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidTask(
                f"{option} of task {task.module_path!r} names arguments by their parameter names (strings), got {name!r}."
            )
        if name == context:
            raise InvalidTask(
                f"{option} of task {task.module_path!r} names {name!r}: that is the context BackWave passes, not an argument of the call, "
                "so it cannot make a key; name one of the arguments the call passes."
            )
        if known is not None and name not in known:
            from difflib import get_close_matches

            close = get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise InvalidTask(
                f"{option} of task {task.module_path!r} names {name!r}, which is not a parameter of {task.func.__name__}({', '.join(known)}).{hint}"
            )


def _is_key_text(value, max_length: int) -> bool:
    """A string PostgreSQL's text holds (no NUL, no lone surrogate) of 1 to max_length characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= max_length or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _validate_unique(task) -> None:
    unique = getattr(task, "unique", None)
    if unique is None:
        return
    path = task.module_path
    if not isinstance(unique, Unique):
        raise InvalidTask(f"unique of task {path!r} must be a backwave.Unique(...), got {unique!r}.")
    if unique.by is not None:
        if isinstance(unique.by, str) or not isinstance(unique.by, tuple) or not unique.by:
            raise InvalidTask(
                f"Unique.by of task {path!r} must be a non-empty tuple of parameter names (or None for all arguments), got {unique.by!r}"
                + (f"; did you mean ({unique.by!r},)?" if isinstance(unique.by, str) else ".")
            )
        _check_argument_names(task, "Unique.by", unique.by)
    if unique.key is not None and not _is_key_text(unique.key, MAX_KEY_LENGTH):
        raise InvalidTask(
            f"Unique.key of task {path!r} must be a string of 1 to {MAX_KEY_LENGTH} characters, got {unique.key!r}."
        )
    if unique.period is not None and not (_is_seconds(unique.period) and MIN_UNIQUE_PERIOD <= unique.period <= MAX_UNIQUE_PERIOD):
        raise InvalidTask(
            f"Unique.period of task {path!r} must be a number of seconds from {MIN_UNIQUE_PERIOD:g} to {MAX_UNIQUE_PERIOD:,.0f} "
            f"(a century), or None for no period, got {unique.period!r}."
        )
    states = unique.states
    if isinstance(states, str) or not isinstance(states, tuple) or any(state not in UNIQUE_STATES for state in states):
        raise InvalidTask(f"Unique.states of task {path!r} must be a tuple of {', '.join(UNIQUE_STATES)}, got {states!r}.")
    if "ready" not in states:
        raise InvalidTask(
            f"Unique.states of task {path!r} must include 'ready' (a waiting job is what a duplicate would join), got {states!r}."
        )
    # A job lets go of its key for good when it first leaves the covered states (the trigger of
    # migration 0008), and it reaches a finished state by running (or, cancelled, straight from
    # ready): a finished state covered without 'running' would find the key already gone.
    finished = [state for state in states if state in UNIQUE_FINISHED_STATES]
    if finished and "running" not in states:
        raise InvalidTask(
            f"Unique.states of task {path!r} covers {', '.join(map(repr, finished))} without 'running', got {states!r}: a job gets "
            "there by running, and lets go of its key for good when it leaves the covered states, so the key would be gone by then. "
            f"Add 'running' (states={(*states, 'running')!r}), or leave the finished states out."
        )
    replace = unique.replace
    if isinstance(replace, str) or not isinstance(replace, tuple) or any(item not in UNIQUE_REPLACEABLE for item in replace):
        raise InvalidTask(f"Unique.replace of task {path!r} must be a tuple of {', '.join(UNIQUE_REPLACEABLE)}, got {replace!r}.")


def _validate_limit_key(task) -> None:
    path = task.module_path
    limit_by, limit_key = getattr(task, "limit_by", None), getattr(task, "limit_key", None)
    if limit_by is not None and limit_key is not None:
        raise InvalidTask(
            f"task {path!r} sets both limit_by ({limit_by!r}) and limit_key ({limit_key!r}); the key comes from one of them."
        )
    if limit_by is not None:
        _check_argument_names(task, "limit_by", [limit_by])
    if limit_key is not None and not _is_key_text(limit_key, MAX_LIMIT_KEY_LENGTH):
        raise InvalidTask(
            f"limit_key of task {path!r} must be a string of 1 to {MAX_LIMIT_KEY_LENGTH} characters, got {limit_key!r}."
        )


@functools.lru_cache(maxsize=1024)
def _signature(func, takes_context: bool) -> inspect.Signature:
    """What a call of the task binds to, built once (inspect.signature per call was a sixth of a
    bulk unique enqueue's client time, 20,000 jobs, py-spy): the function's signature, less the
    first parameter when the task takes a context, since the worker passes the context there
    and the call's arguments after it. Bound to the whole signature, the call's first argument
    would fill ``context`` and every later one shift by one."""
    signature = inspect.signature(func)
    if not takes_context:
        return signature
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _call_signature(task) -> inspect.Signature:
    return _signature(task.func, bool(getattr(task, "takes_context", False)))


def _context_parameter(task) -> str | None:
    """The name of the parameter the context goes to (Django requires ``context``), or None."""
    if not getattr(task, "takes_context", False):
        return None
    first = next(iter(inspect.signature(task.func).parameters), None)
    return first


def _bound_arguments(task, args, kwargs) -> dict[str, Any]:
    """The call's arguments by parameter name (defaults filled in); extra positional arguments
    under "*" and extra keywords under their own names."""
    signature = _call_signature(task)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise InvalidTask(
            f"the arguments of task {task.module_path!r} do not fit {task.func.__name__}{signature}: {error}."
        ) from None
    bound.apply_defaults()
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            named["*"] = list(value)
        else:
            named[name] = value
    return named


def unique_key(task, args, kwargs) -> str | None:
    """The uniqueness key of one call (the task path is put in front by the enqueue), from JSON
    arguments (the payload's): canonical JSON of the chosen arguments, hashed when long."""
    unique = getattr(task, "unique", None)
    if unique is None:
        return None
    if unique.key is not None:
        return unique.key
    named = _bound_arguments(task, args, kwargs)
    if unique.by is not None:
        missing = [name for name in unique.by if name not in named]
        if missing:
            raise InvalidTask(f"Unique.by of task {task.module_path!r} names {missing[0]!r}, which this call does not pass.")
        named = {name: named[name] for name in unique.by}
    # ASCII: any character an argument holds (a NUL, a lone surrogate) becomes an escape that
    # text can store, so the key never fails the INSERT.
    text = json.dumps(named, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_KEY_LENGTH:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def limit_key(task, args, kwargs) -> str | None:
    """The per-key concurrency key of one call: limit_key, or the value of limit_by's argument."""
    explicit = getattr(task, "limit_key", None)
    if explicit is not None:
        return explicit
    name = getattr(task, "limit_by", None)
    if name is None:
        return None
    named = _bound_arguments(task, args, kwargs)
    if name not in named:
        raise InvalidTask(f"limit_by of task {task.module_path!r} names {name!r}, which this call does not pass.")
    value = named[name]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidTask(
            f"limit_by of task {task.module_path!r}: argument {name!r} must be a string or an integer to key a limit by, got {value!r:.100}."
        )
    text = str(value)
    if not _is_key_text(text, MAX_LIMIT_KEY_LENGTH):
        raise InvalidTask(
            f"limit_by of task {task.module_path!r}: argument {name!r} gives the key {text!r:.100}; a key is 1 to {MAX_LIMIT_KEY_LENGTH} characters without NUL."
        )
    return text


MAX_TIMEOUT = 7 * 86_400.0  # a week, as for worker intervals: longer is a unit mistake


def validate_control_options(task) -> None:
    """Check ``timeout``, ``retry_on``, ``discard_on`` and ``backoff``."""
    path = task.module_path
    timeout = getattr(task, "timeout", None)
    if timeout is not None and not (_is_seconds(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise InvalidTask(
            f"timeout of task {path!r} must be a number of seconds above 0 and at most {MAX_TIMEOUT:,.0f} (a week), or None for no limit, got {timeout!r}."
        )
    for name in ("retry_on", "discard_on"):
        kinds = getattr(task, name, ())
        if not isinstance(kinds, tuple) or not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in kinds):
            raise InvalidTask(f"{name} of task {path!r} must be an exception class or a tuple of them, got {kinds!r}.")
    backoff = getattr(task, "backoff", None)
    if backoff is not None and not callable(backoff):
        raise InvalidTask(
            f"backoff of task {path!r} must be a callable backoff(attempt, exception) returning seconds or None, got {backoff!r}."
        )


# --- many at once -----------------------------------------------------------------------------


def coerce_calls(calls: Iterable[TaskCall | tuple]) -> list[TaskCall]:
    """``calls`` as TaskCalls, or InvalidTask naming the first one that is not ``(task, args, kwargs)``."""
    coerced = []
    for position, call in enumerate(calls):
        if not isinstance(call, tuple) or not 1 <= len(call) <= 3 or not isinstance(call[0], Task):
            raise InvalidTask(
                f"enqueue_many: call #{position} must be a (task, args, kwargs) tuple whose task is a django.tasks.Task (a function decorated with @task), got {call!r:.200}."
            )
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
        raise InvalidTask(
            f"enqueue_many writes one statement on one backend, but the tasks use backends {aliases}; call it once per backend."
        )
    backend = task_backends[aliases[0]]
    if not hasattr(backend, "enqueue_many"):
        raise InvalidTask(f"Backend {aliases[0]!r} ({type(backend).__name__}) cannot enqueue many tasks in one statement.")
    return backend.enqueue_many(calls)


async def aenqueue_many(calls: Iterable[TaskCall | tuple]) -> list[TaskResult]:
    """See enqueue_many()."""
    return await sync_to_async(enqueue_many, thread_sensitive=True)(list(calls))

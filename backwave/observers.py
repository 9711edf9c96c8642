"""Transition observers: code that reacts to what happened to jobs, durably, at least once.

    from backwave.observers import observe

    @observe("failed", "quarantined", tasks=[send_invoice])
    def page_on_call(transition):
        ...

An observer is a module-level function decorated with ``@observe(kind, ..., tasks=..., queues=...)``
in a module the worker already imports for tasks (an installed app's ``tasks.py``, or
``BACKWAVE["TASK_MODULES"]``) or in an app's ``observers.py``. The kinds: ``succeeded``,
``failed`` (for good: no attempts left), ``retried`` (failed, will run again), ``cancelled`` (by
an operator, or a workflow's dependent whose ancestor failed, was cancelled or quarantined under
``on_failure="cancel"``), ``quarantined`` (unroutable) and ``lapsed`` (its worker's lease lapsed
mid-attempt). A dependent held for an operator (``on_failure="hold"``) is no transition: it
ended nothing. ``tasks`` (Task objects or their import paths) and ``queues`` narrow it; left
out, every task or queue matches.

How it is fed. The statement that applies a transition (the fenced outcome write, lease expiry,
the admin's cancel, and for the dependents these cancel, the same statement) also inserts a row
into ``backwave_transition`` for it when some observer watches it, in the same statement: an
outcome the lease fence refused never gets one, and a crash after the write cannot lose one.
Each worker runs an observer loop per database it serves (``backwave/shell/observers.py``) that
claims due rows with SKIP LOCKED and calls the matching observers, each call in its own attempt
scope, off the pumps' threads. A row is deleted once every observer of it ran.

Whose a delivery is. A row names the observers it was noted for (those of the writer's registry
that watch it). A worker claims only rows waiting for an observer it has registered, calls those
of them it has, and leaves the row to a worker that has the others: during a rolling deploy a
worker of the older release never settles an observer the newer one added. The Transitions page
shows each waiting row's observers, and says when no live worker has one registered (each
observer loop's claims record what it registered). A writer only notes what its own registry
watches: an outcome an older worker writes gets no row for an observer only newer ones have. An observer that
raises is retried with backoff (the observers of that row that already ran are not run again);
after ``OBSERVER_MAX_DELIVERIES`` tries the row is left *dead*, shown in the admin
(Transitions), where an operator can retry it.

At least once: a worker that dies mid-delivery leaves its rows to be claimed again when their
claim lapses (``OBSERVER_LEASE``), so an observer may see one transition twice; ``transition.id``
is the same both times, which is what to deduplicate on.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.tasks import Task

from .queue_rules import QUEUE_NAME_RULE, is_queue_name

logger = logging.getLogger("backwave.observers")

SUCCEEDED = "succeeded"
FAILED = "failed"
RETRIED = "retried"
CANCELLED = "cancelled"
QUARANTINED = "quarantined"
LAPSED = "lapsed"
KINDS = (SUCCEEDED, FAILED, RETRIED, CANCELLED, QUARANTINED, LAPSED)

MAX_OBSERVER_NAME_LENGTH = 255  # backwave_transition.delivered_to / failed_observer


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One applied transition, as an observer receives it.

    ``id`` identifies the transition across redeliveries; ``delivery`` counts the tries (1 the
    first time). ``attempt`` is the attempt that ended (for a cancel, the job's attempts so far:
    0 for a job that never ran, such as a dependent cancelled because its ancestor failed).
    """

    id: int
    job_id: int
    attempt: int
    kind: str
    task_path: str
    queue: str
    occurred_at: datetime
    delivery: int = 1


class Observer:
    """A function registered with ``@observe``; calling it calls the function."""

    def __init__(
        self,
        func: Callable[[Transition], object],
        *,
        kinds: tuple[str, ...],
        tasks: frozenset[str] | None,
        queues: frozenset[str] | None,
    ) -> None:
        self.func = func
        self.kinds = kinds
        self.tasks = tasks
        self.queues = queues
        self.name = f"{func.__module__}.{func.__qualname__}"
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, transition: Transition) -> object:
        return self.func(transition)

    def matches(self, kind: str, task_path: str, queue: str) -> bool:
        """Whether this observer watches a ``kind`` transition of that task on that queue."""
        return (
            kind in self.kinds
            and (self.tasks is None or task_path in self.tasks)
            and (self.queues is None or queue in self.queues)
        )

    def __repr__(self) -> str:
        return f"<Observer {self.name} of {', '.join(self.kinds)}>"


def observe(
    *kinds: str, tasks: Iterable[Task | str] | None = None, queues: Iterable[str] | None = None
) -> Callable[[Callable[[Transition], object]], Observer]:
    """Register the decorated module-level function as an observer of ``kinds`` transitions of
    ``tasks`` (Task objects or import paths) on ``queues``; None: every task, every queue.
    Mistakes raise ``ValueError`` here, at import, naming what is wrong."""
    if not kinds:
        raise ValueError(f"@observe needs at least one transition kind: {', '.join(KINDS)}.")
    for kind in kinds:
        if kind not in KINDS:
            from difflib import get_close_matches

            close = get_close_matches(str(kind), KINDS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"@observe: unknown transition kind {kind!r}; use {', '.join(KINDS)}.{hint}")
    task_paths = None if tasks is None else frozenset(_task_path(task) for task in _listed(tasks, "tasks"))
    queue_names = None if queues is None else frozenset(_queue_name(queue) for queue in _listed(queues, "queues"))
    if task_paths is not None and not task_paths or queue_names is not None and not queue_names:
        raise ValueError("@observe: an empty tasks or queues list would match nothing; leave it out to match every one.")

    def register(func: Callable[[Transition], object]) -> Observer:
        if isinstance(func, Observer) or not callable(func) or "<locals>" in getattr(func, "__qualname__", "<locals>"):
            raise ValueError(
                f"@observe decorates a module-level function (its name is how deliveries remember it), got {func!r}."
            )
        observer = Observer(func, kinds=tuple(dict.fromkeys(kinds)), tasks=task_paths, queues=queue_names)
        if len(observer.name) > MAX_OBSERVER_NAME_LENGTH:
            raise ValueError(f"observer name {observer.name!r} is longer than {MAX_OBSERVER_NAME_LENGTH} characters.")
        return observer

    return register


def _listed(values, label: str) -> list:
    if isinstance(values, (str, Task)):
        raise ValueError(f"@observe: {label} must be a list, got the single value {values!r}; did you mean [{values!r}]?")
    return list(values)


def _task_path(task) -> str:
    if isinstance(task, Task):
        return task.module_path
    if isinstance(task, str) and task:
        return task
    raise ValueError(
        f"@observe: each of tasks must be a Task (a function decorated with @task) or its import path, got {task!r}."
    )


def _queue_name(queue) -> str:
    if not is_queue_name(queue):
        raise ValueError(f"@observe: each of queues must be {QUEUE_NAME_RULE}, got {queue!r}.")
    return queue


class ObserverRegistry:
    """The observers a process found, by name, and what the store records for them."""

    def __init__(self, observers: Iterable[Observer] = ()):
        self._observers: dict[str, Observer] = {}
        for observer in observers:
            self._observers.setdefault(observer.name, observer)
        rows = {
            (kind, task, queue, observer.name)
            for observer in self._observers.values()
            for kind in observer.kinds
            for task in (sorted(observer.tasks) if observer.tasks is not None else [None])
            for queue in (sorted(observer.queues) if observer.queues is not None else [None])
        }
        # The statements' "observed" parameter: which transitions get a row at all, and the
        # observers each row is for.
        self.observed = json.dumps(
            [{"kind": k, "task_path": t, "queue": q, "observer": o} for k, t, q, o in sorted(rows, key=str)]
        )
        self.names = tuple(sorted(self._observers))  # what a claim of this registry takes (claim_transitions)

    def __len__(self) -> int:
        return len(self._observers)

    def __iter__(self):
        return iter(self._observers.values())

    def get(self, name: str) -> Observer | None:
        return self._observers.get(name)

    def matching(self, transition: Transition) -> list[Observer]:
        """The observers of ``transition``, in name order (the order they are called in)."""
        return sorted(
            (o for o in self._observers.values() if o.matches(transition.kind, transition.task_path, transition.queue)),
            key=lambda o: o.name,
        )

    @classmethod
    def discover(cls, extra_modules: Iterable[str] = ()) -> ObserverRegistry:
        """Import every app's ``tasks`` and ``observers`` modules plus ``extra_modules`` and
        collect the observers defined there."""
        from django.apps import apps

        names = []
        for app_config in apps.get_app_configs():
            for leaf in ("tasks", "observers"):
                candidate = f"{app_config.name}.{leaf}"
                if _module_exists(candidate):
                    names.append(candidate)
        names.extend(extra_modules)
        found = []
        for name in dict.fromkeys(names):
            module = importlib.import_module(name)
            found.extend(value for value in vars(module).values() if isinstance(value, Observer))
        registry = cls(found)
        if len(registry):
            logger.info("Discovered %d transition observer(s)", len(registry))
        return registry


NO_OBSERVERS = ObserverRegistry()


@cache
def discovered() -> ObserverRegistry:
    """This process's observers, discovered once (the admin's cancel and the worker use it)."""
    from . import conf

    return ObserverRegistry.discover(conf.get_setting("TASK_MODULES"))


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False

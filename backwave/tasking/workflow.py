"""Workflows: jobs that wait for other jobs, enqueued in one statement.

A dependent job is inserted ``waiting`` and becomes ready in the same fenced statement that
writes its last ancestor's success (``settle_dependents`` in queries.sql), so no callback can be
lost between the two. The API, on top of ``django.tasks``:

* ``report.enqueue(..., after=[result_a, result_b])``: one job after others (BackWaveTask).
* ``Workflow``: add steps, each ``after`` earlier steps or existing jobs, then ``enqueue()``.
* ``chain(*calls)``, ``group(calls, then=call)``, ``dag(steps, after)``: the usual shapes.

Every shape is one INSERT statement (``enqueue_with_dependencies``), and everything is checked
before anything is written: a cycle, an unknown step, an ancestor from another database, a
policy that does not exist. An ancestor id that names no job, or one that already failed (under
a policy other than ``run``), is refused by that statement, which then writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from types import MappingProxyType
from typing import Any

from django.tasks import Task, TaskResult
from django.tasks.exceptions import InvalidTask

from ..store.contract import DEPENDENCY_POLICIES, After
from .task import MAX_JOB_ID, TaskCall, coerce_calls

MAX_ANCESTORS = 100_000  # per job: a fan-in wider than this is a batch to split


class InvalidDependency(InvalidTask):
    """An ``after=`` that cannot be enqueued: a cycle, an unknown step or job, an ancestor that
    already failed, another database's job, an unknown on_failure. Nothing was written."""


@dataclass(frozen=True, slots=True)
class Step:
    """A job of a Workflow before it is enqueued: what later steps name in their ``after``."""

    workflow: Workflow = field(repr=False, compare=False)
    index: int
    call: TaskCall = field(compare=False)


@dataclass(frozen=True, slots=True)
class Dependency:
    """An ancestor with a policy for its failure: ``Dependency(result, on_failure="hold")``.

    ``on_failure``: what the dependent does if the ancestor fails for good, is cancelled or is
    quarantined: ``"cancel"`` (the default: the dependent is cancelled, the reason naming the
    ancestor, and so are its own cancel-dependents), ``"run"`` (it runs anyway, as if the
    ancestor had succeeded) or ``"hold"`` (it waits for an operator: retrying the ancestor from
    the admin re-arms it; retrying or cancelling the held job decides otherwise).
    """

    ancestor: Any  # a TaskResult, a job id, or a Step of the same Workflow
    on_failure: str = "cancel"

    def __post_init__(self):
        if self.on_failure not in DEPENDENCY_POLICIES:
            raise InvalidDependency(
                f"on_failure must be one of {', '.join(map(repr, DEPENDENCY_POLICIES))}, got {self.on_failure!r}."
            )


class Workflow:
    """Jobs and the order among them, enqueued together with one statement.

        flow = Workflow()
        fetch = flow.add(fetch_page, ["https://example.com"])
        parse = flow.add(parse_page, after=[fetch])
        store = flow.add(store_rows, after=[Dependency(parse, on_failure="hold")])
        results = flow.enqueue()   # TaskResults in the order the steps were added

    A step's ``after`` names earlier steps, ``TaskResult``s of jobs already enqueued (committed
    or in this transaction) or their ids, each bare or wrapped in ``Dependency``.
    """

    def __init__(self) -> None:
        self._steps: list[Step] = []
        self._after: list[tuple[Any, ...]] = []
        self.results: list[TaskResult] | None = None

    def __len__(self) -> int:
        return len(self._steps)

    def add(
        self, task: Task, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *, after: Iterable[Any] = ()
    ) -> Step:
        """Add one job; it runs once every ``after`` ancestor has succeeded."""
        if self.results is not None:
            raise InvalidDependency("this Workflow was enqueued already; build a new one")
        (call,) = coerce_calls([(task, args, MappingProxyType(dict(kwargs or {})))])
        if isinstance(after, (str, bytes, TaskResult, Step, Dependency)) or not isinstance(after, Iterable):
            raise InvalidDependency(f"after= takes a list of ancestors, got {after!r:.200}; wrap a single one in a list.")
        step = Step(self, len(self._steps), call)
        self._steps.append(step)
        self._after.append(tuple(after))
        return step

    def enqueue(self) -> list[TaskResult]:
        """Validate every step, then insert them all with one statement (inside the caller's
        transaction); results in the order the steps were added."""
        from django.tasks import task_backends

        if self.results is not None:
            raise InvalidDependency("this Workflow was enqueued already; build a new one")
        if not self._steps:
            return []
        aliases = sorted({step.call.task.backend for step in self._steps})
        if len(aliases) != 1:
            raise InvalidDependency(f"a Workflow is one statement on one backend, but its tasks use backends {aliases}.")
        backend = task_backends[aliases[0]]
        if not hasattr(backend, "enqueue_dependent"):
            raise InvalidDependency(
                f"Backend {aliases[0]!r} ({type(backend).__name__}) cannot enqueue jobs that wait for others."
            )
        edges = [self._edges(step, after, backend) for step, after in zip(self._steps, self._after, strict=True)]
        _refuse_cycles(edges)
        self.results = backend.enqueue_dependent([step.call for step in self._steps], edges)
        return self.results

    def _edges(self, step: Step, after: tuple[Any, ...], backend) -> tuple[After, ...]:
        edges: dict[tuple[str, int], After] = {}
        for item in after:
            edge = _edge(self, step, item, backend)
            key = ("position", edge.position) if edge.job_id is None else ("job", edge.job_id)
            if key in edges and edges[key].on_failure != edge.on_failure:
                raise InvalidDependency(
                    f"step {step.index} ({step.call.task.module_path}) names the same ancestor twice with different on_failure."
                )
            edges.setdefault(key, edge)
        if len(edges) > MAX_ANCESTORS:
            raise InvalidDependency(f"step {step.index} has {len(edges):,} ancestors; at most {MAX_ANCESTORS:,} are allowed.")
        return tuple(edges.values())


def _edge(workflow: Workflow, step: Step, item: Any, backend) -> After:
    on_failure = "cancel"
    if isinstance(item, Dependency):
        item, on_failure = item.ancestor, item.on_failure
    if isinstance(item, Step):
        if item.workflow is not workflow:
            raise InvalidDependency(
                f"step {step.index} names a step of another Workflow; pass its TaskResult once that one is enqueued."
            )
        if item.index == step.index:
            raise InvalidDependency(f"step {step.index} ({step.call.task.module_path}) cannot wait for itself.")
        return After(position=item.index, on_failure=on_failure)
    if isinstance(item, TaskResult):
        other = _database_of(item.backend)
        if other is not None and other != backend.database:
            raise InvalidDependency(
                f"job {item.id} lives in database {other!r}, but step {step.index} is enqueued into {backend.database!r}: "
                "a job can only wait for jobs of its own database."
            )
        item = item.id
    if isinstance(item, str) and item.isascii() and item.isdigit():
        item = int(item)
    if not isinstance(item, int) or isinstance(item, bool) or not 1 <= item <= MAX_JOB_ID:
        raise InvalidDependency(
            f"after= takes TaskResults, job ids, steps of the same Workflow or Dependency(...) of one of those; got {item!r:.200}."
        )
    return After(job_id=item, on_failure=on_failure)


def _database_of(alias: str) -> str | None:
    from django.tasks import task_backends

    try:
        return getattr(task_backends[alias], "database", None)
    except Exception:  # an alias no longer configured: the statement decides whether the job exists
        return None


def _refuse_cycles(edges: Sequence[tuple[After, ...]]) -> None:
    graph = {index: [edge.position for edge in step if edge.job_id is None] for index, step in enumerate(edges)}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        cycle = " -> ".join(f"step {index}" for index in error.args[1])
        raise InvalidDependency(f"the workflow has a cycle ({cycle}): none of those jobs could ever run.") from None


# --- the usual shapes -----------------------------------------------------------------------------


def chain(*calls: TaskCall | tuple, after: Iterable[Any] = ()) -> list[TaskResult]:
    """Enqueue ``(task, args, kwargs)`` calls each after the one before (the first after
    ``after``), with one statement; results in order."""
    flow = Workflow()
    previous: Iterable[Any] = after
    for call in coerce_calls(calls):
        previous = [flow.add(call.task, call.args, call.kwargs, after=previous)]
    return flow.enqueue()


def group(
    calls: Iterable[TaskCall | tuple],
    *,
    then: TaskCall | tuple | None = None,
    after: Iterable[Any] = (),
    on_failure: str = "cancel",
) -> tuple[list[TaskResult], TaskResult | None]:
    """Fan out: the ``calls`` (each after ``after``), and fan in: ``then``, which runs once all
    of them succeeded (its dependencies on them under ``on_failure``). One statement; returns
    (the calls' results, then's result or None)."""
    flow = Workflow()
    after = list(after)
    members = [flow.add(call.task, call.args, call.kwargs, after=after) for call in coerce_calls(calls)]
    if then is not None:
        (last,) = coerce_calls([then])
        flow.add(last.task, last.args, last.kwargs, after=[Dependency(member, on_failure) for member in members])
    results = flow.enqueue()
    return (results[: len(members)], results[len(members)] if then is not None else None)


def dag(steps: Mapping[str, TaskCall | tuple], after: Mapping[str, Iterable[Any]] | None = None) -> dict[str, TaskResult]:
    """A DAG by name: ``steps`` maps names (strings) to calls, ``after`` a name to what it waits
    for: step names (strings, always: a name is never read as a job id), existing jobs as
    TaskResults or integer ids, or Dependency of any of these. A cycle or an unknown name is
    refused before anything is written; one statement; results by name."""
    if not_text := [name for name in steps if not isinstance(name, str)]:
        raise InvalidDependency(
            f"the step names of a DAG are strings, got {not_text[0]!r} ({type(not_text[0]).__name__}); an existing job goes in after= as its TaskResult or int(id)."
        )
    after = dict(after or {})
    if unknown := sorted(set(after) - set(steps), key=str):
        raise InvalidDependency(f"after= names steps that are not in the DAG: {unknown}.")
    graph: dict[str, list[str]] = {}
    for name in steps:
        names = []
        for item in after.get(name, ()):
            target = item.ancestor if isinstance(item, Dependency) else item
            if isinstance(target, str):
                if target not in steps:
                    raise InvalidDependency(
                        f"step {name!r} waits for {target!r}, which is not a step of the DAG (steps: {sorted(steps)}); "
                        "to wait for an existing job, pass its TaskResult or int(id)."
                    )
                names.append(target)
        graph[name] = names
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise InvalidDependency(
            f"the DAG has a cycle ({' -> '.join(map(repr, error.args[1]))}): none of those jobs could ever run."
        ) from None
    flow = Workflow()
    added: dict[str, Step] = {}
    calls = dict(zip(steps, coerce_calls(steps.values()), strict=True))
    for name in order:
        # Every step name was checked above and comes earlier in the order, so each resolves.
        resolved = []
        for item in after.get(name, ()):
            if isinstance(item, Dependency) and isinstance(item.ancestor, str):
                resolved.append(Dependency(added[item.ancestor], item.on_failure))
            elif isinstance(item, str):
                resolved.append(added[item])
            else:
                resolved.append(item)
        call = calls[name]
        added[name] = flow.add(call.task, call.args, call.kwargs, after=resolved)
    results = flow.enqueue()
    return {name: results[added[name].index] for name in steps}

"""BackWave: background jobs for Django in the application's own PostgreSQL."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module it lives in. Served on first use: settings.py lists "backwave"
# in INSTALLED_APPS and the worker imports backwave.core (pure, Django-free) before Django is set
# up, so importing the package must not import Django's tasks framework or any model.
_EXPORTS = {
    "Ancestor": "backwave.tasking.context",
    "BackWaveTaskResult": "backwave.tasking.results",
    "Cancellation": "backwave.tasking.cancelling",
    "Cancelled": "backwave.tasking.control",
    "Dependency": "backwave.tasking.workflow",
    "Discard": "backwave.tasking.control",
    "EnqueuedResult": "backwave.tasking.results",
    "InvalidArguments": "backwave.tasking.payload",
    "InvalidDependency": "backwave.tasking.workflow",
    "JobContext": "backwave.tasking.context",
    "Snooze": "backwave.tasking.control",
    "TaskCall": "backwave.tasking.task",
    "TaskOptions": "backwave.tasking.task",
    "TimeLimitExceeded": "backwave.tasking.control",
    "Unique": "backwave.tasking.task",
    "UnstorableResult": "backwave.store.storable",
    "Workflow": "backwave.tasking.workflow",
    "aenqueue_many": "backwave.tasking.task",
    "cancel": "backwave.tasking.cancelling",
    "chain": "backwave.tasking.workflow",
    "dag": "backwave.tasking.workflow",
    "enqueue_many": "backwave.tasking.task",
    "group": "backwave.tasking.workflow",
    "task": "backwave.tasking.task",
}

# Written out, not computed: type checkers and linters read a literal list only.
__all__ = [
    "Ancestor",
    "BackWaveTaskResult",
    "Cancellation",
    "Cancelled",
    "Dependency",
    "Discard",
    "EnqueuedResult",
    "InvalidArguments",
    "InvalidDependency",
    "JobContext",
    "Snooze",
    "TaskCall",
    "TaskOptions",
    "TimeLimitExceeded",
    "Unique",
    "UnstorableResult",
    "Workflow",
    "aenqueue_many",
    "cancel",
    "chain",
    "dag",
    "enqueue_many",
    "group",
    "task",
]

# What type checkers and editors read instead of __getattr__ (tests/test_public_api.py holds
# these equal to _EXPORTS).
if TYPE_CHECKING:
    from backwave.store.storable import UnstorableResult
    from backwave.tasking.cancelling import Cancellation, cancel
    from backwave.tasking.context import Ancestor, JobContext
    from backwave.tasking.control import Cancelled, Discard, Snooze, TimeLimitExceeded
    from backwave.tasking.payload import InvalidArguments
    from backwave.tasking.results import BackWaveTaskResult, EnqueuedResult
    from backwave.tasking.task import TaskCall, TaskOptions, Unique, aenqueue_many, enqueue_many, task
    from backwave.tasking.workflow import Dependency, InvalidDependency, Workflow, chain, dag, group


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'backwave' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

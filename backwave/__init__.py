"""BackWave: background jobs for Django in the application's own PostgreSQL."""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so that importing backwave.core (pure, Django-free) never drags Django in.
    if name in {"enqueue_many", "aenqueue_many"}:
        from backwave.tasking import task

        return getattr(task, name)
    if name in {"Workflow", "Dependency", "InvalidDependency", "chain", "group", "dag"}:
        from backwave.tasking import workflow

        return getattr(workflow, name)
    if name in {"Snooze", "Discard", "Cancelled", "TimeLimitExceeded"}:
        from backwave.tasking import control

        return getattr(control, name)
    if name in {"cancel", "Cancellation"}:
        from backwave.tasking import cancelling

        return getattr(cancelling, name)
    if name == "JobContext":
        from backwave.tasking.context import JobContext

        return JobContext
    if name in {"Unique", "EnqueuedResult", "BackWaveTaskResult"}:
        from backwave.tasking import results, task

        return getattr(task if name == "Unique" else results, name)
    if name == "InvalidArguments":
        from backwave.tasking.payload import InvalidArguments

        return InvalidArguments
    if name == "UnstorableResult":
        from backwave.store.storable import UnstorableResult

        return UnstorableResult
    raise AttributeError(f"module 'backwave' has no attribute {name!r}")

"""Tasks the worker tests run (discovered through BACKWAVE['TASK_MODULES'] in tests/settings.py)."""

import os
import threading
import time

from django.db import transaction
from django.tasks import task

from backwave.models import Job


@task(queue_name="e2e")
def noop(n=0):
    return n


@task(queue_name="e2e", takes_context=True, max_attempts=3, backoff_base=0.05, backoff_max=0.05)
def flaky(context, succeed_on):
    """Fails until the given attempt, then returns what it saw."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return {"attempt": context.attempt, "worker_ids": context.task_result.worker_ids}


@task(queue_name="e2e", max_attempts=2, backoff_base=0.01, backoff_max=0.01)
def always_fails():
    raise ValueError("this task always fails")


@task(queue_name="slow")
def sleeper(seconds):
    time.sleep(seconds)
    return seconds


@task(queue_name="e2e")
def leaves_transaction_open(job_id):
    """Enters an atomic block and never leaves it: the attempt scope must clean up after it."""
    transaction.atomic().__enter__()
    Job.objects.filter(id=job_id).update(priority=99)
    return "left open"


@task(queue_name="e2e")
def counts_jobs():
    return Job.objects.count()


@task(queue_name="e2e", max_attempts=1)
def returns_set():
    return {1, 2}


@task(queue_name="e2e", max_attempts=2)
def exits_process():
    os._exit(3)


@task(queue_name="e2e")
async def async_double(n):
    """An async task: runs on the pump's event loop, may use the async ORM."""
    import asyncio

    await asyncio.sleep(0.01)
    return {"double": n * 2, "jobs": await Job.objects.acount()}


@task(queue_name="e2e", max_attempts=1)
async def async_fails():
    raise KeyError("async failure")


# For in-process pumps only: each attempt of the two tasks below records (job id, attempt) when
# its handler starts, and ``hangs_until_released`` blocks its thread until the test sets RELEASE.
STARTED: list[tuple[int, int]] = []
RELEASE = threading.Event()


@task(queue_name="e2e", takes_context=True, max_attempts=5)
def hangs_until_released(context):
    STARTED.append((int(context.task_result.id), context.attempt))
    if not RELEASE.wait(timeout=120):
        raise TimeoutError("the test never released this handler")
    return "released"


@task(queue_name="e2e", takes_context=True, max_attempts=5)
def records_start(context):
    STARTED.append((int(context.task_result.id), context.attempt))
    return context.attempt

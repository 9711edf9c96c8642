"""Tasks the worker tests run (discovered through BACKWAVE['TASK_MODULES'] in tests/settings.py)."""

import fcntl
import json
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


@task(queue_name="e2e")
def counts_running():
    """How many jobs are claimed (running, by the database) while this one runs."""
    return Job.objects.filter(state="running").count()


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


@task(queue_name="e2e")
def backend_pid():
    """One ORM query, and which PostgreSQL session served it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@task(backend="remote", queue_name="remote")
def remote_echo(n=0):
    """A task of the backend whose jobs live in the 'other' database."""
    return {"n": n}


# A file name as os.listdir() gives it for bytes that are not UTF-8: the byte 0xE9 becomes the
# lone surrogate U+DCE9 (PEP 383), which no UTF-8 text and no jsonb string can hold.
SURROGATE_ESCAPED_NAME = b"/data/caf\xe9.csv".decode("utf-8", "surrogateescape")

UNSTORABLE_RESULTS = {
    "nan": lambda: {"rows": [1.0, 2.0, 3.0, float("nan")]},
    "inf": lambda: [float("inf")],
    "nul": lambda: {"name": "a\x00b"},
    "surrogate": lambda: {"files": [SURROGATE_ESCAPED_NAME]},
    "huge_int": lambda: 10**4999,  # 5,000 digits: past Python's int-to-text limit (4,300)
    "set": lambda: {1, 2},
    "too_big": lambda: "x" * (2 * 1024 * 1024),  # 2 MiB, over the default MAX_RESULT_BYTES (1 MiB)
}


@task(queue_name="e2e", max_attempts=1)
def returns_unstorable(kind):
    """Returns a value PostgreSQL cannot store (or that is over the size limit)."""
    return UNSTORABLE_RESULTS[kind]()


@task(queue_name="e2e", max_attempts=1)
def raises_strange_text(kind):
    """Raises with a message no text column can hold as it is."""
    if kind == "surrogate":
        raise FileNotFoundError(f"no such file: {SURROGATE_ESCAPED_NAME}")
    if kind == "nul":
        raise ValueError("bad byte \x00 in the input")
    raise type("E" * 300, (Exception,), {})("an exception class whose name is longer than the error_class column")


# Opened by the in-process pump tests to let attempts that wait for it finish.
GATE = threading.Event()
ENTERED = []  # job ids whose gated attempt has started, in order


@task(queue_name="e2e", takes_context=True, max_attempts=3)
def waits_for_gate_on_first_attempt(context):
    """The first attempt waits for GATE (so a test can take its lease away meanwhile); later
    attempts return at once."""
    if context.attempt == 1:
        ENTERED.append(int(context.task_result.id))
        GATE.wait(timeout=60)
    return context.attempt


@task(queue_name="e2e", takes_context=True, max_attempts=3, backoff_base=0, backoff_max=0)
def retries_at_once(context):
    """The first attempt fails, and the retry is due at once (no backoff)."""
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails on purpose")
    return context.attempt


# Set by an in-process pump test while the pump's first write is in flight.
REST_MAY_FINISH = threading.Event()


@task(queue_name="e2e")
def first_returns_the_rest_wait(n):
    """Job 0 returns at once; the others return once REST_MAY_FINISH is set."""
    if n and not REST_MAY_FINISH.wait(timeout=60):
        raise TimeoutError("the test never let the rest finish")
    return n


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


@task(queue_name="e2e", takes_context=True)
def workflow_source(context, name, value):
    """A workflow's root: records its value and name as Job Output."""
    context.output("value", value)
    context.output("name", name)
    return value


@task(queue_name="e2e", takes_context=True)
def workflow_combine(context, name):
    """Sums its ancestors' outputs; refuses to run before every ancestor succeeded."""
    ancestors = context.ancestors
    if any(a.state != "succeeded" for a in ancestors):
        raise AssertionError(f"ran before its ancestors succeeded: {[(a.job_id, a.state) for a in ancestors]}")
    total = sum(a.output.get("value", 0) for a in ancestors)
    context.output("value", total)
    context.output("name", name)
    context.tag("combined")
    return total


@task(queue_name="e2e", max_attempts=1)
def workflow_fails():
    raise ValueError("this ancestor fails")


# --- attempt control (tests/shell/test_attempt_control_e2e.py) ------------------------------------


@task(queue_name="e2e", takes_context=True, timeout=0.5, max_attempts=2, backoff_base=0.01, backoff_max=0.01)
def overruns_first_attempt(context):
    """Attempt 1 ignores its time limit for a while (keeps its thread); attempt 2 returns at once."""
    if context.attempt == 1:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.01)  # does not look at should_stop(): ended by the worker at the limit
        return "too late"
    return {"attempt": context.attempt, "worker_ids": context.task_result.worker_ids}


# The retry waits 1 to 2 s: longer than the hard limit, so the replacement process runs it.
@task(queue_name="e2e", takes_context=True, timeout=0.5, max_attempts=2, backoff_base=2.0, backoff_max=2.0)
def hangs_on_first_attempt(context):
    """Attempt 1 never returns (until its process goes); attempt 2 says which process ran it."""
    if context.attempt == 1:
        threading.Event().wait(3600)
    return os.getpid()


@task(queue_name="e2e", takes_context=True)
def runs_until_cancelled(context, steps=100_000):
    """Reports progress each step and returns once its context says stop (a cancel)."""
    for step in range(steps):
        if context.should_stop():
            return {"stopped_at": step, "cancelled": context.cancelled}
        if step % 10 == 0:
            context.set_progress({"step": step})
            context.metadata["last_step"] = step
        time.sleep(0.01)
    return "ran to the end"


@task(queue_name="e2e", takes_context=True, max_attempts=1)
def snoozes_once(context):
    import backwave

    if context.attempt == 1:
        raise backwave.Snooze(0.2)
    return context.attempt


@task(queue_name="e2e", max_attempts=5)
def discards():
    import backwave

    raise backwave.Discard("the customer is gone")


@task(queue_name="keyed", limit_by="customer")
def per_customer(customer, seconds=0.0):
    """A job under the keyed queue's per-key limit (BACKWAVE["QUEUES"]["keyed"] in tests/settings.py)."""
    time.sleep(seconds)
    return customer


@task(queue_name="rated")
def rated_noop(n=0):
    """A job of the queue limited to 50 starts a second (tests/settings.py)."""
    return n


@task(queue_name="e2e", atomic=True)
def atomic_noop(n=0):
    """An atomic task: its success is written by its attempt, in its own transaction."""
    return n


def _tally(path, change):
    """Add ``change`` to the handlers running now in the tally file at ``path`` and keep the
    peak: a count shared by every worker thread and process, under a file lock."""
    with open(path, "a+") as tally:
        fcntl.flock(tally, fcntl.LOCK_EX)
        tally.seek(0)
        seen = json.loads(tally.read() or '{"running": 0, "peak": 0, "started": 0}')
        seen["running"] += change
        seen["peak"] = max(seen["peak"], seen["running"])
        seen["started"] += change > 0
        tally.seek(0)
        tally.truncate()
        tally.write(json.dumps(seen))


def _overrun(context, tally, seconds):
    """Attempt 1 ignores its time limit (never looks at should_stop) and runs ``seconds``;
    attempt 2 returns at once. Either counts itself in the tally while it runs."""
    _tally(tally, +1)
    try:
        if context.attempt == 1:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)
        return context.attempt
    finally:
        _tally(tally, -1)


# Keyed per enqueue (.using(limit_key=...)): limit_by on a task that takes a context is issue 32's defect 1.
@task(queue_name="solo", takes_context=True, timeout=0.2, max_attempts=2, backoff_base=0.01, backoff_max=0.01)
def overruns_under_a_key(context, tally, seconds=1.0):
    """A job of the queue with a per-key limit of one (tests/settings.py) that overruns its time limit."""
    return _overrun(context, tally, seconds)


@task(queue_name="single", takes_context=True, timeout=0.2, max_attempts=2, backoff_base=0.01, backoff_max=0.01)
def overruns_in_a_queue(context, tally, seconds=1.0):
    """A job of the queue with a concurrency limit of one (tests/settings.py) that overruns its time limit."""
    return _overrun(context, tally, seconds)


# --- an application's transaction beside the pump (tests/shell/test_application_transactions.py) ---


@task(queue_name="e2e", takes_context=True)
def reports_until_file(context, path):
    """Reports progress (what the heartbeat writes) until the file exists, then returns its attempt."""
    step = 0
    while not os.path.exists(path):
        context.set_progress({"step": step})
        step += 1
        time.sleep(0.02)
    return context.attempt

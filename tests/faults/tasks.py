"""Tasks the fault tests run (registered through BACKWAVE['TASK_MODULES'] in tests/settings.py)."""

import os
import time
from pathlib import Path

from django.db import connection
from django.tasks import task

from backwave.models import FINISHED_STATES, Job


@task(queue_name="faults")
def work(seconds=0.0):
    time.sleep(seconds)
    return seconds


@task(queue_name="faults", takes_context=True)
def slow_first_attempt(context, seconds):
    """The first attempt takes ``seconds`` (long enough to be killed in); later ones are instant."""
    if context.attempt == 1:
        time.sleep(seconds)
    return context.attempt


@task(queue_name="faults", takes_context=True)
def outlived(context, timeout=120.0):
    """The zombie's job: the first attempt waits until someone else has finished the job (its own
    lease lapsed and another worker ran it again), then returns, so its outcome is written late."""
    job_id = int(context.task_result.id)
    if context.attempt == 1:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and Job.objects.get(id=job_id).state not in FINISHED_STATES:
            time.sleep(0.05)
        return "zombie"
    return "second"


@task(queue_name="faults")
def trips_the_driver():
    """Claiming it makes a pump hit an invariant violation (see hooks.halt_on_task)."""
    return "ran after the halt"


@task(queue_name="faults", max_attempts=3, backoff_base=0.05, backoff_max=0.05, takes_context=True)
def fails_once(context):
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return context.attempt


@task(queue_name="faults", max_attempts=3)
def kills_its_worker():
    """Ends the whole worker process on every attempt, as a segfault or the OOM killer would."""
    os._exit(3)


# The effect table of the effect-once tests (created and dropped by them): one row per attempt
# whose database writes landed.
EFFECTS = "backwave_test_effect"


def _effect_then_hold(context, marker_dir: str) -> int:
    """Write this attempt's effect row; on the first attempt say so ("inside") and hold until
    the test says "go" (it is SIGSTOPped meanwhile and outlives its lease)."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (job_id, attempt) VALUES (%s, %s)", [int(context.task_result.id), context.attempt])
    if context.attempt == 1:
        Path(marker_dir, "inside").touch()
        while not Path(marker_dir, "go").exists():
            time.sleep(0.02)
    return context.attempt


@task(queue_name="faults", takes_context=True, atomic=True)
def atomic_effect(context, marker_dir):
    """Effect-once: the effect row commits with the fenced outcome, or not at all."""
    return _effect_then_hold(context, marker_dir)


@task(queue_name="faults", takes_context=True)
def plain_effect(context, marker_dir):
    """The same work without atomic: the effect row commits on its own, whatever the fence says."""
    return _effect_then_hold(context, marker_dir)


@task(queue_name="faults", max_attempts=2, backoff_base=0.05, backoff_max=0.05, takes_context=True)
def observed_work(context, fail_first=False):
    """A job the observer tests watch: fails its first attempt when asked."""
    if fail_first and context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return context.attempt

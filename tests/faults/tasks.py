"""Tasks the fault tests run (registered through BACKWAVE['TASK_MODULES'] in tests/settings.py)."""

import os
import time

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

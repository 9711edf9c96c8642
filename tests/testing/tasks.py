"""Tasks the deterministic pump tests run (handed to the pump with tasks=[this module])."""

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.tasks import task

from backwave.tasking.task import enqueue_many


@task
def add(a, b):
    return a + b


@task(queue_name="emails")
def send_email(to, subject=""):
    return f"sent to {to}"


@task(takes_context=True, max_attempts=3, backoff_base=2.0, backoff_max=2.0)
def flaky(context, succeed_on):
    """Fails until the given attempt, then returns the attempt and who ran the earlier ones."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return {"attempt": context.attempt, "worker_ids": context.task_result.worker_ids}


@task(max_attempts=2, backoff_base=1.0, backoff_max=1.0)
def always_fails():
    raise ValueError("this task always fails")


@task
def fan_out(n):
    """Enqueues n add jobs: run in the same drain, as a worker would pick them up."""
    enqueue_many([(add, (i, i), {}) for i in range(n)])
    return n


@task
def make_user(username):
    User.objects.create(username=username)
    return username


@task
def make_user_twice(username):
    """Creates a user, then breaks the transaction with a duplicate it catches (no atomic)."""
    User.objects.create(username=username)
    try:
        User.objects.create(username=username)
    except IntegrityError:
        return "caught"
    return "no error?"


@task
def leaves_atomic_open(username):
    transaction.atomic().__enter__()
    User.objects.create(username=username)
    return "left open"


@task
def enqueues_itself():
    enqueues_itself.enqueue()


CALLBACK = None  # set by a test


@task
def calls_back():
    CALLBACK()


@task
async def async_add(a, b):
    return a + b


@task(backend="remote", queue_name="remote")
def remote_add(a, b):
    """A task of the backend whose jobs live in the 'other' database."""
    return a + b


@task(max_attempts=1)
def returns_nan():
    return {"score": float("nan")}


@task(max_attempts=1)
def returns_a_set():
    return {"ids": {1, 2}}


# --- attempt control: a task moves the test pump's clock to say "this took that long" -----------

PUMP = {}  # the test puts its pump here: PUMP["pump"] = pump


@task(takes_context=True, timeout=10.0, max_attempts=2, backoff_base=1.0, backoff_max=1.0)
def slow_first_time(context):
    if context.attempt == 1:
        PUMP["pump"].advance(11)  # ran past its 10 s limit
        PUMP["saw_stop"] = context.should_stop()
        return "too late"
    return context.attempt


@task(takes_context=True, max_attempts=1)
def snoozes(context, seconds):
    import backwave

    if context.attempt == 1:
        raise backwave.Snooze(seconds)
    context.set_progress({"done": True})
    return context.attempt


@task(takes_context=True)
def cancels_itself(context):
    import backwave

    backwave.cancel(context.task_result.id, by="test")
    PUMP["pump"].advance(1300)  # past a heartbeat (a third of the test lease), which brings the cancel back
    return "finished anyway"


class Gone(Exception):
    pass


class Busy(Exception):
    pass


@task(max_attempts=5, discard_on=(Gone,), retry_on=(Busy, Gone), backoff=lambda attempt, exc: 7.0 if attempt < 3 else None)
def ruled(kind):
    raise {"gone": Gone, "busy": Busy, "other": KeyError}[kind](kind)


def _broken_backoff(attempt, exc):
    raise SystemExit("the backoff itself is broken")


@task(max_attempts=2, backoff_base=1.0, backoff_max=1.0, backoff=_broken_backoff)
def broken_backoff():
    raise ValueError("fails")


@task(queue_name="emails", limit_by="customer")
def running_beside(customer):
    """How many jobs of this customer run right now, this one included (per-key limit tests)."""
    from backwave.models import Job

    return Job.objects.filter(state="running", limit_key=customer).count()


@task(max_attempts=3, backoff=lambda attempt, exc: 1e15)
def backs_off_for_ages():
    """Its backoff answers a delay past any date the database holds."""
    raise ValueError("fails")


@task(takes_context=True, max_attempts=1)
def snoozes_for_ages(context):
    from datetime import timedelta

    from backwave.tasking.control import Snooze

    if context.attempt == 1:
        raise Snooze(timedelta(days=366))
    return context.attempt

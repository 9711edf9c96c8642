"""Tasks and observers of the test pump's observer tests (handed over with tasks= and observers=).

The observers write down what they saw in SEEN; FLAKY_FAILURES makes ``flaky_observer`` raise
that many times first."""

from django.contrib.auth.models import User
from django.tasks import task

from backwave.observers import observe

SEEN: list[tuple[str, int, int, str, int]] = []  # (observer, job id, attempt, kind, delivery)
FLAKY_FAILURES = {"left": 0}


@task(queue_name="e2e", max_attempts=2, backoff_base=1.0, backoff_max=1.0, takes_context=True)
def fails_once(context):
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return context.attempt


@task(queue_name="e2e")
def quiet():
    return "nobody watches me"


@task(queue_name="e2e", atomic=True)
def make_user_atomically(username, fail=False):
    User.objects.create(username=username)
    if fail:
        raise RuntimeError("after the write")
    return username


@observe("succeeded", "retried", "failed", tasks=[fails_once, make_user_atomically])
def watch(transition):
    SEEN.append(("watch", transition.job_id, transition.attempt, transition.kind, transition.delivery))


@observe("succeeded", tasks=["tests.testing.observing.fails_once"])
def flaky_observer(transition):
    if FLAKY_FAILURES["left"]:
        FLAKY_FAILURES["left"] -= 1
        raise ConnectionError("the pager is down")
    SEEN.append(("flaky_observer", transition.job_id, transition.attempt, transition.kind, transition.delivery))


@observe("succeeded", tasks=[make_user_atomically])
def enqueues_a_follow_up(transition):
    """An observer may enqueue work: the same drain runs it."""
    quiet.enqueue()


async def async_handler():
    """Not a task: the test that refuses atomic for async tasks wraps it."""

"""A user's module, annotated throughout, that ``mypy --strict`` checks against the installed
wheel (tests/userproject/test_typing.py): every BackWave name it uses must have a type there."""

from datetime import timedelta
from typing import Any

import backwave
from backwave import BackWaveTaskResult, Cancellation, Dependency, JobContext, Snooze, TaskCall, Unique, Workflow
from backwave.observers import Transition, observe
from backwave.testing import DeterministicPump, DrainResult, JobAssertions, capture_enqueued

ONE_PER_USER = Unique(by=("user_id",), period=60.0)
NIGHTLY = Unique.debounce(key="nightly", period=300.0)


@backwave.task(queue_name="emails", max_attempts=5, retry_on=[ConnectionError], unique=ONE_PER_USER)
def send_welcome(user_id: int) -> str:
    return f"welcome, {user_id}"


def welcome_soon(user_id: int) -> BackWaveTaskResult:
    return send_welcome.using(priority=10, tags=["signup"], limit_key="mail").enqueue(user_id, after=[41])


def cancel_quietly(job_id: int) -> bool:
    return backwave.cancel(job_id, by="support") is not Cancellation.FINISHED


def enqueue_all(calls: list[TaskCall]) -> list[Any]:
    return list(backwave.enqueue_many(calls))


def pipeline(fetch: TaskCall, store: TaskCall) -> int:
    flow = Workflow()
    fetched = flow.add(fetch.task, fetch.args)
    flow.add(store.task, store.args, after=[Dependency(fetched, on_failure="hold")])
    by_name = backwave.dag({"fetch": fetch, "store": store}, after={"store": ["fetch"]})
    return len(flow.enqueue()) + len(by_name) + len(backwave.chain(fetch, store))


def later() -> Snooze:
    return Snooze(timedelta(hours=1))


def report(context: JobContext, page: int) -> float | None:
    context.set_progress({"page": page})
    context.tag("report")
    context.raise_if_stopping()
    return context.time_left()


@observe("failed", "quarantined", queues=["emails"])
def page_on_call(transition: Transition) -> None:
    print(transition.job_id, transition.kind, transition.occurred_at.isoformat())


def drained(pump: DeterministicPump) -> int:
    result: DrainResult = pump.drain(limit=100)
    pump.advance(30.0)
    return result.succeeded + result.failed + len(result.errors)


def emails(jobs: JobAssertions) -> int:
    with capture_enqueued() as captured:
        pass
    return len(jobs.all(queue="emails")) + len(captured)

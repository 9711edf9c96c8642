"""One pump, in-process, against the real store, when the reply of a statement that committed is
lost (the connection drops after COMMIT): the driver hears StoreFailed although the rows changed."""

from __future__ import annotations

import time

import pytest

from backwave.core.jobs import OutcomeKind
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Attempt, Job
from backwave.shell.pump import HEALTHY, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.contract import TransientStoreError
from backwave.store.postgres import PostgresStore
from tests.shell import worker_tasks

pytestmark = pytest.mark.django_db(transaction=True)


class LosesTheReplyOfARetryThatReclaimed:
    """A real PostgresStore whose first write_outcomes_then_claim that re-claims the job it wrote a
    retry for commits, and then reports a lost connection instead of its answer."""

    def __init__(self):
        self.inner = PostgresStore.from_django()
        self.lost_replies = 0

    def write_outcomes_then_claim(self, *, outcomes, **kwargs):
        applied, claimed = self.inner.write_outcomes_then_claim(outcomes=outcomes, **kwargs)
        retried = {o.job_id for o in outcomes if o.kind is OutcomeKind.RETRY}
        if not self.lost_replies and retried & {job.id for job in claimed}:
            self.lost_replies += 1
            raise TransientStoreError("write_outcomes_then_claim failed: server closed the connection unexpectedly")
        return applied, claimed

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_lost_reply_of_a_retry_that_reclaimed_its_job_does_not_strand_it():
    """backoff 0: the retry write and the claim riding on it commit (attempt 2 runs under the same
    lease), the reply is lost. The job must still run attempt 2 to completion, not sit running
    under the pump's live, renewed lease for ever."""
    result = worker_tasks.retries_at_once.enqueue()
    store = LosesTheReplyOfARetryThatReclaimed()
    # pool 2: the slot beside the buffered outcome lets the retried claim (and its reconcile) go
    # at once; the lease (10 minutes) outlives the test, so only the pump itself can free the job.
    options = WorkerGroupOptions(
        name="lost", policy=Strict("e2e"), pool_size=2, poll_interval=0.05, maintenance_interval=3600, lease_duration=600
    )
    pump = Pump(options, 0, store_factory=lambda: store, registry=TaskRegistry([worker_tasks.retries_at_once]))
    pump.start()
    try:
        finished = _wait_until(lambda: Job.objects.get(id=result.id).state == "succeeded")
        job = Job.objects.get(id=result.id)
        live_lease = pump.driver.lease_id
    finally:
        pump.drain(timeout=5)
        assert pump.join(10)
    assert finished, (
        f"job {job.id} is {job.state} at attempt {job.attempts}, under the pump's live lease: {job.lease_id == live_lease}"
    )
    assert store.lost_replies == 1
    assert (job.attempts, job.return_value) == (2, 2)
    assert list(Attempt.objects.filter(job=job).values_list("number", "state")) == [(1, "failed"), (2, "succeeded")]
    assert pump.driver.stats.reconciled == 1
    assert pump.health == HEALTHY

"""The pump's store thread: while a write or a claim waits for PostgreSQL, the pump thread goes on
feeding the driver the jobs that finish, and the jobs claimed ahead take the threads they free."""

from __future__ import annotations

import time
from datetime import UTC

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.jobs import ClaimedJob, Outcome, OutcomeKind
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.shell.executor import Executor
from backwave.store.contract import Applied, TransientStoreError
from backwave.store.postgres import PostgresStore
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.test_claim_ahead import drain_on_one_thread

HELD_WRITE = 2  # the pump's second write: by then jobs wait claimed ahead of its one thread
HOLD_FOR = 2  # jobs to see start while that write is held


class HeldStore(PostgresStore):
    """The real store, whose ``HELD_WRITE``-th write waits, before it goes to the server, until
    ``HOLD_FOR`` more jobs have started (for at most 5 s): a write that is slow to answer."""

    writes = 0
    started_while_held: int | None = None

    def _hold(self) -> None:
        HeldStore.writes += 1
        if HeldStore.writes != HELD_WRITE:
            return
        before = len(worker_tasks.STARTED)
        deadline = time.monotonic() + 5
        while len(worker_tasks.STARTED) < before + HOLD_FOR and time.monotonic() < deadline:
            time.sleep(0.005)
        HeldStore.started_while_held = len(worker_tasks.STARTED) - before

    def write_outcomes_many(self, **kwargs):
        self._hold()
        return super().write_outcomes_many(**kwargs)

    def write_outcomes_then_claim(self, **kwargs):
        self._hold()
        return super().write_outcomes_then_claim(**kwargs)


@pytest.mark.django_db(transaction=True)
def test_jobs_claimed_ahead_start_while_a_write_waits_for_the_database():
    worker_tasks.STARTED.clear()
    HeldStore.writes, HeldStore.started_while_held = 0, None
    drain_on_one_thread(worker_tasks.records_start, claim_ahead=3, store_factory=HeldStore.from_django)
    # The one thread ran two jobs one after the other while the write was held: each finish was
    # fed to the driver during the call, and the next job claimed ahead started on it.
    assert HeldStore.started_while_held >= HOLD_FOR
    ids = sorted(Job.objects.values_list("id", flat=True))
    assert sorted(worker_tasks.STARTED) == [(job_id, 1) for job_id in ids]  # each ran once
    assert Job.objects.filter(attempts=1).count() == 8


# ---- the executor's side, against a scripted driver and a store double ---------------------------

OPTIONS = WorkerGroupOptions(name="g", policy=Strict("default"), pool_size=2)
LEASE = __import__("uuid").UUID(int=1)


def _job(job_id: int) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        task_path="t",
        queue="default",
        priority=0,
        payload={},
        attempt=1,
        max_attempts=1,
        backoff_base=1.0,
        backoff_max=1.0,
    )


class Written:
    """A store double that answers a write-then-claim: every outcome applied, no job claimed."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.calls = 0

    def write_outcomes_then_claim(self, *, outcomes, **_kwargs):
        self.calls += 1
        if self.fail:
            raise TransientStoreError("connection lost")
        return Applied({o.job_id for o in outcomes}), []

    def write_outcomes_many(self, *, outcomes, **_kwargs):
        self.calls += 1
        return Applied({o.job_id for o in outcomes})


def _executor(store) -> Executor:
    return Executor(
        store,
        options=OPTIONS,
        worker_id="test:1:g:0",
        hostname="test",
        pid=1,
        clock=lambda: 1.0,
        jitter=lambda: 0.0,
        time_zone=lambda: UTC,
        new_lease_id=lambda: LEASE,
        on_fault=lambda error: None,
    )


WRITE = cmd.WriteOutcomes(lease_id=LEASE, outcomes=(Outcome(job_id=1, attempt=1, kind=OutcomeKind.SUCCEEDED),))
CLAIM = cmd.ClaimJobs(lease_id=LEASE, queues=("default",), limit=1)
FINISHED = ev.JobFinished(now=0.5, job_id=2, attempt=1, result=None, jitter=0.0)


def _scripted(answers: dict[type, list[cmd.Command]], seen: list):
    """A driver that records each event it is fed and answers by the event's type."""

    def handle(event):
        seen.append(event)
        return list(answers.get(type(event), []))

    return handle


def _run(store, *, aside_given: bool):
    seen: list = []
    done: list = []  # what was carried out, in order: ("job", id) or ("store", ...)
    later = cmd.WriteOutcomes(lease_id=LEASE, outcomes=(Outcome(job_id=2, attempt=1, kind=OutcomeKind.SUCCEEDED),))
    handle = _scripted({ev.Started: [WRITE, CLAIM], ev.JobFinished: [cmd.ExecuteJob(job=_job(3)), later]}, seen)

    finishes = [FINISHED]

    def aside(call, early):
        done.append(("store", "held"))
        while finishes:
            early(finishes.pop())  # a job finished while the first call ran
        return call()

    executor = _executor(store)
    executor.process(
        handle,
        ev.Started(now=0.0),
        execute_job=lambda job: done.append(("job", job.id)),
        arrived=(lambda: ()) if aside_given else (lambda: [finishes.pop()] if finishes else ()),
        aside=aside if aside_given else None,
    )
    return seen, done


def test_with_aside_a_job_finished_during_the_call_starts_the_next_job_at_once_and_its_write_waits():
    store = Written()
    seen, done = _run(store, aside_given=True)
    assert done[:2] == [("store", "held"), ("job", 3)]  # started before the held call answered
    kinds = [type(event).__name__ for event in seen]
    # The driver sees what it sees without aside: the finish before the call's answers.
    assert kinds == ["Started", "JobFinished", "OutcomesWritten", "ClaimReturned", "OutcomesWritten"]
    assert store.calls == 2  # the write-then-claim, then the finished job's write after it


def test_the_driver_is_fed_the_same_events_in_the_same_order_with_aside_or_without():
    with_aside, _ = _run(Written(), aside_given=True)
    without, _ = _run(Written(), aside_given=False)
    assert [type(e) for e in with_aside] == [type(e) for e in without]
    assert with_aside[1:] == without[1:]


def test_a_call_that_fails_aside_fails_the_write_and_its_claim_and_the_early_commands_still_follow():
    seen, done = _run(Written(fail=True), aside_given=True)
    assert ("job", 3) in done
    failed = [event.command for event in seen if isinstance(event, ev.StoreFailed)]
    assert [type(c) for c in failed[:2]] == [cmd.WriteOutcomes, cmd.ClaimJobs]


def test_an_error_that_is_not_transient_comes_out_of_process():
    class Broken(Written):
        def write_outcomes_then_claim(self, **kwargs):
            raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        _run(Broken(), aside_given=True)


# ---- a pump that is never idle still ticks --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_fed_without_a_pause_still_renews_its_lease(start_worker):
    """15,000 no-ops on a lease of one second: the pump's channel never runs dry (jobs finish
    while each write is in flight, and the write they make is the next call), so no Tick ever
    came from waiting for it, and the lease lapsed for want of a heartbeat. On the build before
    the fix this drain gave its lease up every 0.9 s from the first second on, so 15,000 fail
    there as surely as the 60,000 this test used to run, in a quarter of the time. One lease
    for the whole drain, every job run once."""
    enqueue_many([(worker_tasks.noop, (n,), {}) for n in range(15_000)])
    worker = start_worker("--queues", "e2e", "--pool-size", "16", "--lease-duration", "1", "--until-idle", "--log-every", "3600")
    assert worker.wait(timeout=240) == 0, worker.output
    assert "gave up its lease" not in worker.output, worker.output
    assert Job.objects.filter(state="succeeded").count() == 15_000
    assert not Job.objects.exclude(attempts=1).exists()  # none ran twice


def test_a_deadline_that_passes_during_a_call_is_fed_as_a_tick_before_the_next_call():
    """The executor's side: every call brings in a finished job whose write is the next call.
    ``due`` says a deadline passed after the second call; its Tick is fed then, not when the
    chain ends."""
    seen: list = []
    calls = []

    def handle(event):
        seen.append(type(event).__name__)
        if isinstance(event, ev.JobFinished) and len(calls) < 5:
            return [
                cmd.WriteOutcomes(
                    lease_id=LEASE, outcomes=(Outcome(job_id=len(calls) + 10, attempt=1, kind=OutcomeKind.SUCCEEDED),)
                )
            ]
        return []

    def aside(call, early):
        calls.append(call)
        early(FINISHED)
        return call()

    executor = _executor(Written())
    executor.process(
        handle, FINISHED, execute_job=lambda job: None, aside=aside, due=lambda: ev.Tick(now=2.0) if len(calls) == 2 else None
    )
    assert len(calls) == 5
    # The Tick comes after the second call's answer, with three calls of the chain still to go.
    assert seen.index("Tick") == seen.index("OutcomesWritten") + 2
    assert seen[seen.index("Tick") + 1 :].count("OutcomesWritten") == 4

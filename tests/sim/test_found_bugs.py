"""Bugs the simulator found, each pinned by the seed that found it.

1. Fixed. After a pipelined WriteOutcomes + ClaimJobs failed, the production pump still ran the
   other ClaimJobs of a Weighted pass, sized for the slots the failed write would have freed:
   the pump then held more than pool_size jobs, and the driver halted it ("backpressure
   violated") when they came back. Found by seed 356 (and 893, 1043, 1251, 1640, 2037, 2108 of
   the first 2,300) of the first version of the simulator, seed 2315 of the version with queue
   limits and pauses; the unit test below pins the fix without depending on the simulator.

2. Fixed. A transient fault that loses the reply of a statement that did commit (the connection
   drops after COMMIT) is reported to the driver as StoreFailed, which the driver read as
   "nothing happened". For a claim, the claimed jobs stayed running under the pump's live lease,
   unknown to the driver, until the pump died (seed 5: more than pool_size jobs under one lease;
   seed 44: jobs never finish while the pump lives). For an outcome write, the driver put the
   applied outcomes back in its buffer; when the job ran again on the same pump first, one batch
   carried two outcomes of one job and the store refused it (seed 4462: the pump halts). The
   fix: after a failed claim the driver sends ReconcileLease (give back what runs under the
   lease that it does not hold) before its next claim, and a claim that returns a job drops any
   outcome of an older attempt of it still buffered.

The seeds were found before the simulator drew what it draws now: they run under ``CLASSIC``,
which draws exactly what that version drew, so each replays the scenario that found its bug.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import NodeDriver
from backwave.core.jobs import ClaimedJob
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Weighted
from backwave.shell.pump import Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.contract import TransientStoreError
from backwave.testing.simulation import CLASSIC, Config, run_seed

LEASE = uuid.UUID(int=7)


class BrokenStore:
    """The pipelined write fails; any claim that still runs is recorded."""

    def __init__(self):
        self.claims: list[tuple[str, ...]] = []

    def write_outcomes_then_claim(self, **kwargs):
        raise TransientStoreError("connection lost")

    def claim_jobs(self, *, queues, **kwargs):
        self.claims.append(tuple(queues))
        return []

    def record_pumps_many(self, **kwargs):
        pass


def job(job_id: int, queue: str) -> ClaimedJob:
    return ClaimedJob(
        id=job_id, task_path="t.t", queue=queue, priority=0, payload={}, attempt=1, max_attempts=1, backoff_base=1, backoff_max=1
    )


def one_job_left(driver: NodeDriver) -> NodeDriver:
    """The driver of a Weighted pump that ran one job of each queue, and has one left running."""
    driver.handle(ev.Started(now=0.0))
    for command in driver.handle(ev.LeaseOpened(now=0.0, lease_id=LEASE)):
        if isinstance(command, cmd.ClaimJobs):  # each claim of the pass comes back full
            driver.handle(ev.ClaimReturned(now=0.0, jobs=(job(1, "a"),) if command.queues == ("a",) else (job(2, "b"),)))
    driver.handle(ev.JobFinished(now=0.1, job_id=1, attempt=1, result="succeeded"))
    return driver


def test_the_pump_runs_no_claim_that_rode_on_a_failed_write():
    options = WorkerGroupOptions(name="g", policy=Weighted({"a": 1, "b": 1}), pool_size=2, claim_ahead=0)
    last = ev.JobFinished(now=0.2, job_id=2, attempt=1, result="succeeded")
    # The last job's end flushes both outcomes, with one claim per queue riding on the write.
    flush = one_job_left(NodeDriver(options)).handle(last)
    assert [type(c).__name__ for c in flush] == ["WriteOutcomes", "ClaimJobs", "ClaimJobs"]

    # The pump's clock is the events' (it asks the driver what came due by it).
    pump = Pump(options, 0, store_factory=BrokenStore, registry=TaskRegistry(), clock=lambda: last.now)
    pump._pool.shutdown()  # no handler runs here
    pump._store = store = BrokenStore()
    pump.driver = one_job_left(NodeDriver(options))
    pump._process(last)

    assert store.claims == [], "a claim sized for the failed write's slots ran"
    assert (pump.driver.unreported, pump.driver.free_slots) == (2, 0)  # both outcomes wait to be written again


@pytest.mark.parametrize("seed", [2315])
def test_the_seed_that_found_the_weighted_claim_bug_passes(seed):
    run_seed(seed, CLASSIC)


@pytest.mark.parametrize("seed", [5, 44, 4462])
def test_lost_replies_of_committed_statements(seed):
    run_seed(seed, replace(CLASSIC, ambiguous_faults=True))


def test_a_crash_by_a_job_already_purged_kills_its_process_and_charges_nobody():
    """Seed 21965 (lost replies on): a handler given up with its lease crashed its process after
    its job had been retried elsewhere, finished and purged. The simulator looked the crasher's
    row up to see who ran beside it, and failed on the missing row instead of going on."""
    run_seed(21965, Config(ambiguous_faults=True, job_control=False))  # before job control was drawn


def test_a_failed_give_back_of_jobs_claimed_ahead_strands_none_of_them():
    """Seed 1686 (job control's first 10,000): a handler past its time limit made its pump give
    back the job claimed ahead behind it, and that ReleaseJobs failed. The job stayed running
    under the pump's live lease, unknown to its driver, which renewed the lease for ever: it
    never reached a final state. Fixed: a failed ReleaseJobs reconciles the lease before the
    next claim, as a failed claim does."""
    run_seed(1686)

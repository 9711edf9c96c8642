"""Atomic tasks: an attempt that committed its own fenced outcome (JobFinished "committed")."""

from __future__ import annotations

from backwave.core import commands as cmd
from backwave.core.jobs import Outcome, OutcomeKind

from .helpers import LEASE, Trace, claim, execute


def test_a_committed_attempt_is_applied_and_frees_its_slot_without_a_write():
    t, jobs = Trace.with_jobs(2, pool_size=4)
    assert t.finished(jobs[0], "committed", now=0.5) == []  # another still executes, and 3 slots < a batch of 32
    assert t.driver.unreported == 1
    assert t.driver.stats.applied == 1
    # The last one: nothing executes any more and nothing is buffered, so a claim of its own.
    assert t.finished(jobs[1], "committed", now=0.6) == [claim(4)]
    assert t.driver.stats.applied == 2 and t.driver.stats.writes == 0


def test_committed_and_buffered_outcomes_share_the_claim_of_the_flush():
    t, jobs = Trace.with_jobs(2, pool_size=4)
    assert t.finished(jobs[0], now=0.5) == []  # buffered: a plain task's success
    out = t.finished(jobs[1], "committed", now=0.6)
    assert out == [
        cmd.WriteOutcomes(lease_id=LEASE, outcomes=(Outcome(job_id=jobs[0].id, attempt=1, kind=OutcomeKind.SUCCEEDED),)),
        claim(4),
    ]


def test_free_slots_that_fill_an_outcome_batch_are_claimed_at_once():
    t, jobs = Trace.with_jobs(3, pool_size=3, max_outcome_batch=2)
    assert t.finished(jobs[0], "committed", now=0.1) == []  # one free slot is not a batch yet
    out = t.finished(jobs[1], "committed", now=0.2)
    assert out == [claim(2)]  # two are: claimed while the third still runs
    fresh = t.jobs.make(2)
    assert t.returned(*fresh, now=0.3) == execute(*fresh)


def test_a_committed_attempt_while_draining_lets_the_drain_release():
    t, jobs = Trace.with_jobs(1, pool_size=4)
    assert t.drain(now=0.1) == []  # one still executes
    out = t.finished(jobs[0], "committed", now=0.2)
    assert out == [cmd.ReleaseLease(lease_id=LEASE)]

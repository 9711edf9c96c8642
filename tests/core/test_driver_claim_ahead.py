"""Claim-ahead: a pump whose work is known to be short holds claimed jobs beyond its threads.

While one batch runs, the write of the last batch's outcomes and the claim of the next are in
flight: a thread that finishes takes the next job claimed ahead at once, instead of waiting a
round-trip with its slot empty. The room ahead opens only once the pump has seen its tasks
finish under CLAIM_AHEAD_HORIZON; a job claimed ahead is claimed, not executing (core/slots.py,
***** in core/transitions.py).
"""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.claims import refusal
from backwave.core.driver import InvalidEvent, State
from backwave.core.jobs import OutcomeKind
from backwave.core.options import CLAIM_AHEAD_HORIZON, WorkerGroupOptions

from .helpers import LEASE, LEASE2, JobFactory, Trace, claim, execute, ids_of, of_type

AHEAD = dict(pool_size=2, max_claim_batch=4, claim_ahead=4, poll_interval=1000.0, maintenance_interval=5000.0)


def seen_finishing(t: Trace) -> None:
    """The first two jobs ran and were written: the task is known short, a claim of 4 in flight."""
    a, b = t.jobs.make(2)
    assert t.returned(a, b) == execute(a, b)  # nothing seen finishing yet: a claim for the threads alone
    assert t.finished(a) == []
    write, ride = t.finished(b)
    assert ids_of(write) == [a.id, b.id]
    assert ride == claim(4)  # the task is known short now: the threads and the room ahead, up to a batch
    assert t.written(write) == []  # the claim rides behind it


def claimed_ahead(t: Trace):
    """Two threads, both busy, and two jobs claimed ahead behind them; a claim of 2 in flight."""
    seen_finishing(t)
    c, d, e, f = t.jobs.make(4)
    # Two start, two wait; a full batch says more is waiting, and the room left is 2.
    assert t.returned(c, d, e, f) == [*execute(c, d), claim(2)]
    assert (t.driver.executing, t.driver.unreported) == (2, 4)
    return c, d, e, f


def test_a_finished_thread_takes_the_next_job_claimed_ahead_while_the_write_and_claim_are_on_their_way():
    t = Trace.running(**AHEAD)
    c, d, e, f = claimed_ahead(t)
    assert t.finished(c) == execute(e)
    assert t.finished(d) == execute(f)
    g, h = t.jobs.make(2)
    assert t.returned(g, h) == []  # no thread free: both wait, and the room is full
    assert t.driver.free_slots == 0
    assert t.finished(e) == execute(g)
    *started, write, ride = t.finished(f)
    assert started == execute(h)
    assert ids_of(write) == [c.id, d.id, e.id, f.id]  # a full batch
    assert ride == claim(4)  # what the write frees, up to a batch: g and h still run


def test_no_claim_ahead_before_the_pump_has_seen_its_tasks_finish():
    t = Trace.running(**AHEAD)
    assert t.log[-2][1][0] == claim(2)  # the first claim: the threads alone
    a, b = t.jobs.make(2)
    t.returned(a, b)
    assert t.driver.free_slots == 0


def test_a_job_of_a_task_not_seen_finishing_closes_the_room_ahead_while_it_runs():
    t = Trace.running(**AHEAD)
    seen_finishing(t)
    new = t.jobs.one(task_path="app.tasks.never_seen")
    known = t.jobs.one()
    assert t.returned(new, known) == execute(new, known)  # short: nothing more is waiting
    assert t.finished(known) == []
    assert t.driver.free_slots == 0  # the threads alone, both held: the unknown task could be long
    assert t.finished(new)[-1] == claim(4)  # seen now, and short: the room is back


def test_a_task_that_took_the_horizon_or_longer_keeps_the_pump_claiming_for_its_threads_only():
    t = Trace.running(**AHEAD)
    a, b = t.jobs.make(2)
    t.returned(a, b, now=0.0)
    t.finished(a, now=CLAIM_AHEAD_HORIZON)  # learned: the horizon
    write, ride = t.finished(b, now=CLAIM_AHEAD_HORIZON)
    assert ride == claim(2)


def test_claim_ahead_zero_claims_for_free_threads_only():
    t = Trace.running(**{**AHEAD, "claim_ahead": 0})
    a, b = t.jobs.make(2)
    t.returned(a, b)
    t.finished(a)
    write, ride = t.finished(b)
    assert ride == claim(2)


def test_a_cancel_of_a_job_claimed_ahead_ends_it_unstarted():
    t = Trace.running(**AHEAD)
    c, d, e, f = claimed_ahead(t)
    assert t.send(ev.CancelRequested(now=t.now, job_id=e.id, by="ops")) == []  # no StopAttempt: nothing runs it
    assert t.finished(c) == execute(f)  # e is skipped
    assert t.finished(d) == []  # waits for the claim in flight (***), then goes with it
    g, h = t.jobs.make(2)
    assert t.returned(g, h) == execute(g)  # f still runs: h waits
    started, write, ride = t.finished(f)
    assert started == cmd.ExecuteJob(job=h)
    assert ids_of(write) == [e.id, c.id, d.id, f.id]  # a full batch, the cancelled one first
    cancelled = write.outcomes[0]
    assert cancelled.kind is OutcomeKind.CANCELLED
    assert cancelled.reason == "cancelled by ops (before this attempt started)"


def test_a_drain_gives_the_jobs_claimed_ahead_back_unstarted():
    t = Trace.running(**AHEAD)
    c, d, e, f = claimed_ahead(t)
    assert t.drain() == [cmd.ReleaseJobs(lease_id=LEASE, job_ids=(e.id, f.id))]
    assert t.driver.state is State.DRAINING
    assert t.finished(c) == []  # nothing starts any more
    assert t.driver.unreported == 2  # d executing, c's outcome; the claim in flight comes back to be given back
    g, h = t.jobs.make(2)
    assert t.returned(g, h) == [cmd.ReleaseJobs(lease_id=LEASE, job_ids=(g.id, h.id))]


def test_a_lost_lease_drops_the_jobs_claimed_ahead_and_keeps_the_threads_of_the_abandoned_handlers():
    t = Trace.running(**{**AHEAD, "poll_interval": 1.0})
    c, d, e, f = claimed_ahead(t)
    assert cmd.RenewLease(lease_id=LEASE) in t.tick(10.0)
    assert t.renewed(False, now=10.1) == [cmd.OpenLease()]
    # No room ahead while abandoned handlers hold the threads: they may never return.
    assert (t.driver.executing, t.driver.unreported, t.driver.free_slots) == (0, 0, 0)
    assert t.driver.stats.abandoned == 4  # c and d abandoned, e and f dropped (they lapse with the lease)
    t.opened(LEASE2, now=10.2)
    assert t.finished(c, now=10.3) == []  # its thread is free; nothing waits for it
    assert t.driver.free_slots == 1  # d's handler still holds the other thread
    assert t.finished(d, now=10.4) == []
    assert t.driver.free_slots == 2 + 4  # every thread back: the room ahead reopens


def test_a_job_claimed_ahead_gets_its_deadline_when_it_starts():
    t = Trace.running(**AHEAD)
    seen_finishing(t)
    c, d = t.jobs.make(2)
    timed = t.jobs.one(timeout=5.0)
    assert t.returned(c, d, timed, now=0.0)[:2] == execute(c, d)
    assert t.finished(c, now=3.0)[0] == cmd.ExecuteJob(job=timed)
    assert of_type(t.tick(7.9), cmd.StopAttempt) == []  # 5 s from its start, not from its claim
    assert of_type(t.tick(8.0), cmd.StopAttempt) == [cmd.StopAttempt(job_id=timed.id, attempt=1, reason="timeout")]


def test_a_reconcile_counts_the_jobs_claimed_ahead_as_held():
    t = Trace.running(**{**AHEAD, "poll_interval": 1.0})
    c, d, e, f = claimed_ahead(t)
    assert t.failed(claim(2), now=0.1) == []
    (reconcile,) = of_type(t.tick(5.0), cmd.ReconcileLease)
    assert {(e.id, 1), (f.id, 1), (c.id, 1), (d.id, 1)} <= set(reconcile.known)


def test_a_claim_returning_a_job_claimed_ahead_here_is_refused():
    t = Trace.running(**AHEAD)
    c, d, e, f = claimed_ahead(t)
    with pytest.raises(InvalidEvent, match="already holds"):
        t.returned(e)


def test_the_backpressure_bound_is_the_pool_and_the_room_ahead():
    jobs = JobFactory().make(3)
    bound = dict(queued=set(), obsolete=0, abandoned=0, pool_size=2, ahead=4)
    assert refusal(jobs, 3, {}, unreported=3, **bound) is None
    assert (
        refusal(jobs, 3, {}, unreported=4, **bound) == "backpressure violated: 4 unreported + 3 claimed > pool_size 2 + 4 ahead"
    )


def test_jobs_ahead_defaults_to_three_claim_batches_less_the_pool_and_one_batch_at_least():
    assert WorkerGroupOptions(name="g").jobs_ahead == 76  # pool 20, batch 32
    assert WorkerGroupOptions(name="g", pool_size=16).jobs_ahead == 80
    assert WorkerGroupOptions(name="g", pool_size=64).jobs_ahead == 32
    assert WorkerGroupOptions(name="g", max_claim_batch=7).jobs_ahead == 7
    assert WorkerGroupOptions(name="g", max_claim_batch=7, claim_ahead=0).jobs_ahead == 0


def test_an_attempt_ended_past_its_deadline_gives_the_jobs_claimed_ahead_back():
    """Its handler may never return and keep its thread: the jobs waiting for a thread could wait
    behind it (behind both, were the other to hang too) while the heartbeat keeps their lease."""
    t = Trace.running(**AHEAD)
    seen_finishing(t)
    slow = t.jobs.one(timeout=5.0)
    c, e, f = t.jobs.make(3)
    assert t.returned(slow, c, e, f, now=0.0)[:2] == execute(slow, c)
    commands = t.tick(5.0)
    assert cmd.StopAttempt(job_id=slow.id, attempt=1, reason="timeout") in commands
    assert cmd.ReleaseJobs(lease_id=LEASE, job_ids=(e.id, f.id)) in commands
    assert t.finished(c, now=5.1) == []  # nothing waits for its thread any more
    assert t.driver.unreported == 2  # the two outcomes (slow's, c's); e and f went back


def test_a_failed_give_back_of_the_jobs_claimed_ahead_reconciles_the_lease_before_the_next_claim():
    """The ReleaseJobs of the jobs claimed ahead failed: they still run under the live lease, and
    the driver no longer holds them. The next claim must reconcile the lease first (as after a
    failed claim), or they sit running, never executed, under a lease the pump renews for ever
    (the simulator's seed 1686)."""
    t = Trace.running(**AHEAD)
    seen_finishing(t)
    slow = t.jobs.one(timeout=5.0)
    c, e, f = t.jobs.make(3)
    t.returned(slow, c, e, f, now=0.0)
    assert t.returned(now=0.01) == []  # the claim of 2 in flight brings nothing
    (give_back,) = of_type(t.tick(5.0), cmd.ReleaseJobs)
    assert t.failed(give_back, now=5.05) == []
    write, *rest = t.finished(c, now=5.1)
    assert ids_of(write) == [slow.id, c.id]
    assert of_type(rest, cmd.ClaimJobs) == [], rest  # not before the reconcile
    assert rest == [cmd.ReconcileLease(lease_id=LEASE, known=((slow.id, 1), (c.id, 1)))]

"""An attempt abandoned with a lost lease keeps its slot until its handler returns.

A pump's pool has exactly ``pool_size`` threads, and a handler the driver gave up on still
occupies one of them until it returns. A job claimed for that thread would sit in the pool's
queue, unstarted, while its new lease ticks (for ever, behind a hung handler). So the driver
counts abandoned attempts among the taken slots until their JobFinished arrives, and never
claims a job it has no thread for.
"""

from __future__ import annotations

from backwave.core import commands as cmd
from backwave.core.driver import State

from .helpers import LEASE, LEASE2, MAINTENANCE, Trace, claim, execute, ids_of


def lose_lease(t: Trace, now: float = 10.0) -> None:
    """The heartbeat at ``now`` finds the lease gone: every running attempt is abandoned."""
    assert cmd.RenewLease(lease_id=LEASE) in t.tick(now)
    assert t.renewed(False, now=now + 0.1) == [cmd.OpenLease()]


def test_slots_stay_taken_after_a_lease_loss_until_the_abandoned_handlers_return():
    t, jobs = Trace.with_jobs(2, pool_size=2, poll_interval=1.0, maintenance_interval=5000.0)
    lose_lease(t)
    assert (t.driver.executing, t.driver.unreported, t.driver.free_slots) == (0, 0, 0)
    # The new lease's first poll finds both threads still busy with the abandoned handlers.
    assert t.opened(LEASE2, now=10.2) == MAINTENANCE
    assert t.tick(11.2) == []
    assert t.finished(jobs[0], now=11.5) == []  # abandoned: no outcome, but its thread is free
    assert t.driver.free_slots == 1
    assert t.tick(12.2) == [claim(1, LEASE2)]
    fresh = t.jobs.one()
    assert t.returned(fresh, now=12.3) == execute(fresh)  # a full batch, but no thread is free
    assert t.driver.free_slots == 0
    assert t.finished(jobs[1], now=13.0) == []
    assert t.driver.free_slots == 1
    assert t.tick(13.3) == [claim(1, LEASE2)]  # the poll after the last claim


def test_the_claim_riding_a_write_leaves_the_abandoned_slots_out():
    t, (old,) = Trace.with_jobs(1, pool_size=3, poll_interval=1000.0, maintenance_interval=5000.0)
    lose_lease(t)
    assert t.opened(LEASE2, now=10.2) == [claim(2, LEASE2), *MAINTENANCE]
    a, b = t.jobs.make(2)
    assert t.returned(a, b, now=10.3) == execute(a, b)
    assert t.finished(a, now=10.4) == []
    write, ride = t.finished(b, now=10.5)  # nothing of this lease executes: write, and claim behind it
    assert ids_of(write) == [a.id, b.id]
    assert ride == claim(2, LEASE2)  # the write frees two slots; the third still runs the old handler


def test_an_abandoned_attempt_of_a_job_claimed_again_holds_its_own_slot():
    """The lease lapsed and was expired, and this pump claimed the job again (attempt 2) while
    attempt 1 still runs: two threads, two slots."""
    t, (old,) = Trace.with_jobs(1, pool_size=2, poll_interval=1000.0, maintenance_interval=5000.0)
    lose_lease(t)
    assert t.opened(LEASE2, now=10.2) == [claim(1, LEASE2), *MAINTENANCE]
    again = t.jobs.one(id=old.id, attempt=2)
    assert t.returned(again, now=10.3) == execute(again)
    assert t.driver.free_slots == 0
    assert t.finished(old, "failed", now=10.4) == []  # attempt 1 returns: its slot reopens
    assert (t.driver.executing, t.driver.free_slots) == (1, 1)


def test_a_drain_does_not_wait_for_abandoned_handlers():
    t, (old,) = Trace.with_jobs(1, pool_size=2, poll_interval=1000.0, maintenance_interval=5000.0)
    lose_lease(t)
    t.opened(LEASE2, now=10.2)
    assert t.returned(now=10.3) == []
    assert t.drain(timeout=100.0, now=10.4) == [cmd.ReleaseLease(lease_id=LEASE2)]
    assert t.lease_released(now=10.5) == []
    assert t.driver.state is State.STOPPED
    assert t.finished(old, now=11.0) == []  # it returns after the pump stopped: nothing to do


def test_a_lease_lost_while_reopening_abandons_nothing_new_and_keeps_the_old_slots():
    t, jobs = Trace.with_jobs(2, pool_size=3, poll_interval=1000.0, maintenance_interval=5000.0)
    lose_lease(t)
    assert t.opened(LEASE2, now=10.2) == [claim(1, LEASE2), *MAINTENANCE]
    fresh = t.jobs.one()
    t.returned(fresh, now=10.3)
    assert t.tick(20.2) == [cmd.RenewLease(lease_id=LEASE2)]
    assert t.renewed(False, now=20.3) == [cmd.OpenLease()]  # the second lease is lost too
    assert t.driver.free_slots == 0  # three handlers run, abandoned under two leases
    assert t.driver.stats.abandoned == 3
    for job in (*jobs, fresh):
        assert t.finished(job, now=21.0) == []
    assert t.driver.free_slots == 3

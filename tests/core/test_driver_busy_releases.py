"""Busy releases (******** in core/transitions.py): a ReleaseJobs or ReconcileLease that passed over
jobs whose rows another transaction held. Those jobs still run under the live lease, held by no
one and never executed: the driver gives them back again after poll_interval, until none is busy."""

from __future__ import annotations

from backwave.core import commands as cmd
from backwave.core import events as ev

from .helpers import LEASE, LEASE2, Trace, claim, of_type


def test_a_busy_release_is_sent_again_after_poll_interval_until_none_is_busy():
    t = Trace.running(poll_interval=1.0)
    # The answer to a ReleaseJobs of jobs 5 and 6 (claimed ahead, given back): 6 was held.
    assert t.jobs_released([5], busy=[6], now=0.1) == []  # not again at once
    assert t.driver.next_wakeup() <= 1.1
    assert of_type(t.tick(0.5), cmd.ReleaseJobs) == []
    (again,) = of_type(t.tick(1.1), cmd.ReleaseJobs)
    assert again == cmd.ReleaseJobs(lease_id=LEASE, job_ids=(6,))
    assert t.jobs_released([], busy=[6], now=1.2) == []  # held still: once more
    (last,) = of_type(t.tick(2.2), cmd.ReleaseJobs)
    assert last == again
    assert t.jobs_released([6], now=2.3) == []
    assert of_type(t.tick(3.3), cmd.ReleaseJobs) == []  # done: nothing more to give back
    assert t.driver.stats.released_again == 2


def test_a_reconcile_that_passed_a_held_job_over_gives_it_back_later_and_claims_meanwhile():
    t = Trace.running(poll_interval=1.0)
    t.failed(claim(20), now=0.1)
    assert t.tick(1.1) == [cmd.ReconcileLease(lease_id=LEASE, known=())]
    # The claim does not wait for the held job: the driver knows which one to give back.
    assert t.send(ev.LeaseReconciled(now=1.2, released=frozenset(), busy=frozenset({77}))) == [claim(20)]
    (again,) = of_type(t.tick(2.2), cmd.ReleaseJobs)
    assert again == cmd.ReleaseJobs(lease_id=LEASE, job_ids=(77,))


def test_a_lost_lease_forgets_the_busy_releases():
    t = Trace.running(poll_interval=5.0, lease_duration=6.0, heartbeat_interval=2.0)
    t.jobs_released([], busy=[5, 6], now=0.1)
    (beat,) = of_type(t.tick(2.0), cmd.RenewLease)
    t.renewed(held=False, now=2.1)  # they lapse with the lease
    t.opened(LEASE2, now=2.2)
    assert of_type(t.tick(5.2), cmd.ReleaseJobs) == []

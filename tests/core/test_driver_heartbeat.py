"""The lease: heartbeats, losing it, fencing ourselves when renewals stop landing, and maintenance."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core.driver import SELF_FENCE_MARGIN, InvalidEvent, State

from .helpers import MAINTENANCE, LEASE, LEASE2, Trace, claim, execute, ids_of, of_type

RENEW = cmd.RenewLease(lease_id=LEASE)


def quiet(**overrides):
    """RUNNING on LEASE with an empty first claim answered; polls and maintenance far away."""
    overrides.setdefault("poll_interval", 1000.0)
    overrides.setdefault("maintenance_interval", 5000.0)
    t = Trace.running(**overrides)
    assert t.returned(now=0.0) == []
    return t


def test_renews_every_heartbeat_interval():
    t = quiet(lease_duration=30.0)
    assert t.driver.next_wakeup() == 10.0
    for n in range(1, 6):
        assert t.tick_at_wakeup() == [RENEW]
        assert t.now == 10.0 * n
        assert t.renewed(True, now=t.now + 0.1) == []
    assert t.driver.stats.heartbeats == 5


def test_explicit_heartbeat_interval_wins():
    t = quiet(lease_duration=30.0, heartbeat_interval=4.0)
    times = []
    for _ in range(3):
        assert t.tick_at_wakeup() == [RENEW]
        times.append(t.now)
        t.renewed(True)
    assert times == [4.0, 8.0, 12.0]


def test_one_renewal_in_flight_at_a_time():
    t = quiet()
    assert t.tick(10.0) == [RENEW]
    assert t.tick(20.0) == []  # the first has not come back: do not stack another
    assert t.renewed(True, now=20.5) == []
    assert t.tick(30.0) == [RENEW]


def test_a_tick_before_the_heartbeat_is_due_sends_nothing():
    t = quiet()
    assert t.tick(9.99) == []


def test_lost_lease_abandons_running_jobs_drops_the_buffer_and_reopens():
    t, jobs = Trace.with_jobs(3, pool_size=4, poll_interval=1000.0)
    t.finished(jobs[0], now=1.0)  # buffered
    assert t.tick(10.0) == [RENEW]
    assert t.renewed(False, now=10.1) == [cmd.OpenLease()]
    d = t.driver
    assert (d.state, d.lease_id, d.executing, d.unreported) == (State.OPENING, None, 0, 0)
    assert d.stats.abandoned == 2
    assert d.next_wakeup() is None
    assert t.finished(jobs[1], "failed", now=11.0) == []  # abandoned: ignored, no outcome
    # jobs[2]'s handler still runs on one of the four threads: its slot stays taken until it returns.
    assert t.opened(LEASE2, now=11.5) == [claim(3, LEASE2), *MAINTENANCE]
    assert t.finished(jobs[2], now=12.0) == []  # abandoned, finishing after the new lease: ignored
    fresh = t.jobs.make(2)
    t.returned(*fresh, now=12.1)
    t.finished(fresh[0], now=12.2)
    write, ride = t.finished(fresh[1], now=12.3)
    assert write.lease_id == LEASE2 and ids_of(write) == [4, 5]
    written = [i for _, cs in t.log for c in of_type(cs, cmd.WriteOutcomes) for i in ids_of(c)]
    assert written == [4, 5]  # nothing from the lost lease was ever written


def test_an_abandoned_job_id_finishing_twice_is_refused_the_second_time():
    t, jobs = Trace.with_jobs(1, poll_interval=1000.0)
    t.tick(10.0)
    t.renewed(False, now=10.1)
    assert t.finished(jobs[0], now=11.0) == []
    with pytest.raises(InvalidEvent, match="not executing"):
        t.finished(jobs[0], now=11.1)


@pytest.mark.parametrize("old_first", [True, False], ids=["old-attempt-first", "new-attempt-first"])
def test_an_abandoned_attempt_finishing_after_its_job_was_claimed_again_is_ignored(old_first):
    """Lease lost, the job was expired and claimed again by this pump (attempt 2) while the old
    attempt still ran. The old attempt's JobFinished must not halt the pump, in either order."""
    t, (old,) = Trace.with_jobs(1, pool_size=2, poll_interval=1000.0)
    t.tick(10.0)
    t.renewed(False, now=10.1)
    t.opened(LEASE2, now=10.2)
    again = t.jobs.one(id=old.id, attempt=2)
    assert t.returned(again, now=10.3) == execute(again)
    if old_first:
        assert t.finished(old, "failed", now=10.4) == []  # attempt 1: from the lost lease
        assert t.driver.executing == 1
    write, ride = t.finished(again, now=10.5)
    assert [(o.job_id, o.attempt) for o in write.outcomes] == [(old.id, 2)]
    if not old_first:
        assert t.finished(old, "failed", now=10.6) == []
    assert t.driver.unreported == 1  # only the write of attempt 2


def test_self_fence_when_no_renewal_lands_for_a_lease():
    t, jobs = Trace.with_jobs(2, pool_size=4, poll_interval=1.0, lease_duration=30.0)
    trusted_until = 30.0 * (1 - SELF_FENCE_MARGIN)
    renew_attempts = []
    while t.driver.state is State.RUNNING:
        out = t.tick_at_wakeup()
        assert t.now <= trusted_until
        for command in out:
            if isinstance(command, cmd.RenewLease):
                renew_attempts.append(t.now)
                t.failed(command)  # the database is unreachable
            elif isinstance(command, cmd.ClaimJobs):
                t.returned()
    assert t.now == pytest.approx(trusted_until)
    assert out == [cmd.OpenLease()]
    assert renew_attempts[0] == 10.0 and len(renew_attempts) >= 10  # retried every poll_interval
    assert (t.driver.state, t.driver.executing, t.driver.stats.abandoned) == (State.OPENING, 0, 2)
    assert t.finished(jobs[0], now=t.now + 1) == []


def test_trust_runs_from_when_the_landed_renewal_was_sent():
    t = quiet(lease_duration=30.0)
    assert t.tick(10.0) == [RENEW]
    assert t.renewed(True, now=15.0) == []  # slow, but it was stamped no earlier than 10
    while t.driver.state is State.RUNNING:
        for command in of_type(t.tick_at_wakeup(), cmd.RenewLease):
            t.failed(command)
    assert t.now == pytest.approx(10.0 + 27.0)


def test_a_tick_just_inside_the_trusted_window_keeps_the_lease():
    t = quiet(lease_duration=30.0)
    t.tick(10.0)
    t.failed(RENEW, now=10.0)
    assert t.tick(26.99) == [RENEW]
    assert t.driver.state is State.RUNNING


def test_failed_renewal_is_retried_after_poll_interval():
    t = quiet(lease_duration=30.0, poll_interval=2.0)
    assert t.tick(10.0) == [claim(20), RENEW]
    assert t.returned(now=10.0) == []
    assert t.failed(RENEW, now=10.5) == []
    assert t.driver.next_wakeup() == pytest.approx(12.0)  # the next poll...
    assert t.tick(12.0) == [claim(20)]  # ...but the renew retry is at 12.5
    assert t.returned(now=12.0) == []
    assert t.tick(12.5) == [RENEW]
    assert t.driver.stats.store_faults == 1


# ---- maintenance ---------------------------------------------------------------------------------


def test_maintenance_runs_every_maintenance_interval():
    t = quiet(lease_duration=3000.0, maintenance_interval=30.0)
    assert t.expired(4, now=0.1) == [claim(20)]  # the jobs it released are claimable at once
    t.returned(now=0.1)
    times = []
    for _ in range(3):
        assert t.tick_at_wakeup() == [*MAINTENANCE]
        times.append(t.now)
        t.expired(0)
        t.rolled_up(0)
    assert times == [30.0, 60.0, 90.0]


def test_failed_maintenance_waits_for_the_next_interval():
    t = quiet(lease_duration=3000.0, maintenance_interval=30.0)
    assert t.failed(cmd.ExpireLeases(), now=0.2) == []
    assert t.driver.next_wakeup() == 30.0
    assert t.tick(30.0) == [*MAINTENANCE]


def test_heartbeat_and_maintenance_due_together_come_in_order():
    t = quiet(lease_duration=30.0, maintenance_interval=10.0)
    assert t.tick(10.0) == [RENEW, *MAINTENANCE]


def test_renewal_answered_after_the_lease_was_released_is_ignored():
    t = quiet(lease_duration=30.0)
    assert t.drain(timeout=5.0, now=9.0) == [cmd.ReleaseLease(lease_id=LEASE)]
    assert t.tick(10.0) == [RENEW]  # heartbeats continue while the release is in flight
    assert t.lease_released(now=10.1) == []
    assert t.renewed(False, now=10.2) == []  # STOPPED: the renewed lease was already given back
    assert t.driver.state is State.STOPPED


# ---- results that come back after the lease was given up (see the report) ------------------------


def test_a_claim_queued_behind_a_lost_renewal_does_not_halt_the_pump():
    t, jobs = Trace.with_jobs(3, pool_size=4, poll_interval=10.0, maintenance_interval=1000.0)
    t.finished(jobs[0], now=5.0)
    tick = t.tick(10.0)  # poll and heartbeat due together
    assert tick == [claim(1), cmd.WriteOutcomes(lease_id=LEASE, outcomes=tick[1].outcomes), RENEW]
    # The pump runs the list in order, feeding each result back before the next command runs.
    assert t.returned(now=10.0) == []
    repoll = t.written({1}, now=10.0)
    assert repoll == [claim(2)]  # queued after the RenewLease
    assert t.renewed(False, now=10.0) == [cmd.OpenLease()]
    stale = t.jobs.make(2)
    out = t.returned(*stale, now=10.1)  # the queued claim ran under the dead lease
    assert of_type(out, cmd.ExecuteJob) == []
    assert t.opened(LEASE2, now=10.2)[0] == claim(2, LEASE2)  # two abandoned handlers still hold their threads


def test_a_renewal_landing_after_a_self_fence_is_ignored():
    t = quiet(lease_duration=30.0)
    assert t.tick(10.0) == [RENEW]  # the store hangs on it
    assert t.tick(27.0) == [cmd.OpenLease()]
    assert t.renewed(True, now=28.0) == []

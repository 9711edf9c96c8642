"""Drain: stop claiming, let running jobs finish (within the deadline), flush, give the lease back."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core.driver import InvalidEvent, State

from .helpers import LEASE, LEASE2, Trace, ids_of, of_type

RELEASE = cmd.ReleaseLease(lease_id=LEASE)


def claims_after(t: Trace, index: int) -> list[cmd.ClaimJobs]:
    return [c for _, cs in t.log[index:] for c in of_type(cs, cmd.ClaimJobs)]


def test_drain_stops_claims_writes_what_finished_then_releases():
    t, jobs = Trace.with_jobs(2, pool_size=4, poll_interval=1.0)
    mark = len(t.log)
    assert t.drain(timeout=10.0, now=0.5) == []
    assert t.driver.state is State.DRAINING
    assert t.driver.next_wakeup() == 10.0  # heartbeat at 10, deadline 10.5
    assert t.tick(1.0) == []  # a poll would be due: no claim
    assert t.hint(1.1) == []
    assert t.finished(jobs[0], now=2.0) == []  # one still runs
    write = t.finished(jobs[1], "failed", jitter=0.5, now=3.0)
    assert [ids_of(c) for c in write] == [[1, 2]]
    assert t.written(write[0], now=3.1) == [RELEASE]
    assert t.lease_released(now=3.2) == []
    d = t.driver
    assert (d.state, d.lease_id, d.next_wakeup(), d.executing) == (State.STOPPED, None, None, 0)
    assert t.tick(100.0) == [] and t.hint(100.0) == []
    assert claims_after(t, mark) == []


def test_drain_with_nothing_held_releases_at_once():
    t = Trace.running()
    t.returned(now=0.1)
    assert t.drain(now=0.2) == [RELEASE]
    assert t.lease_released(now=0.3) == []
    assert t.driver.state is State.STOPPED


def test_a_second_drain_request_changes_nothing():
    t, jobs = Trace.with_jobs(1)
    t.drain(timeout=5.0, now=1.0)
    assert t.drain(timeout=500.0, now=2.0) == []
    assert t.driver.next_wakeup() == 6.0  # the first deadline stands


def test_heartbeats_continue_and_maintenance_stops_while_draining():
    t, jobs = Trace.with_jobs(1, lease_duration=30.0, maintenance_interval=10.0, poll_interval=1000.0)
    t.drain(timeout=100.0, now=1.0)
    assert t.tick(10.0) == [cmd.RenewLease(lease_id=LEASE)]
    assert t.renewed(True, now=10.1) == []
    assert t.tick(20.0) == [cmd.RenewLease(lease_id=LEASE)]


def test_deadline_flushes_the_buffer_releases_and_ignores_late_finishes():
    t, jobs = Trace.with_jobs(2, poll_interval=1.0)
    t.drain(timeout=5.0, now=1.0)
    assert t.finished(jobs[0], now=2.0) == []
    assert t.driver.next_wakeup() == 6.0
    assert t.tick(5.9) == []
    write = t.tick(6.0)
    assert [ids_of(c) for c in write] == [[1]]  # the buffer first...
    assert t.written({1}, now=6.1) == [RELEASE]  # ...then the lease, with job 2 still running
    assert t.lease_released(now=6.2) == []
    assert t.driver.state is State.STOPPED
    assert t.driver.stats.abandoned == 1
    assert t.finished(jobs[1], now=7.0) == []  # its row was given back: the outcome is not ours


def test_deadline_with_an_empty_buffer_releases_at_once():
    t, jobs = Trace.with_jobs(1)
    t.drain(timeout=2.0, now=1.0)
    assert t.tick(3.0) == [RELEASE]


def test_a_job_finishing_while_the_release_is_in_flight_is_not_written():
    t, jobs = Trace.with_jobs(1)
    t.drain(timeout=2.0, now=1.0)
    assert t.tick(3.0) == [RELEASE]
    assert t.finished(jobs[0], now=3.1) == []
    assert t.lease_released(now=3.2) == []
    assert [c for _, cs in t.log for c in of_type(cs, cmd.WriteOutcomes)] == []


def test_jobs_of_a_claim_in_flight_are_released_not_run():
    t = Trace.running(pool_size=4)
    assert t.drain(now=0.1) == []  # the first claim is in flight: wait for it
    a, b = t.jobs.make(2)
    assert t.returned(a, b, now=0.2) == [cmd.ReleaseJobs(lease_id=LEASE, job_ids=(1, 2)), RELEASE]
    assert t.driver.executing == 0
    assert t.jobs_released({1, 2}, now=0.3) == []
    assert t.lease_released(now=0.4) == []
    assert t.driver.state is State.STOPPED
    assert t.driver.stats.claimed == 2


def test_a_claim_in_flight_while_jobs_run_releases_only_its_own_jobs():
    t, jobs = Trace.with_jobs(1, pool_size=4)
    t.hint(0.5)  # short claim answered: the hint claims again
    t.drain(now=0.6)
    late = t.jobs.one()
    assert t.returned(late, now=0.7) == [cmd.ReleaseJobs(lease_id=LEASE, job_ids=(late.id,))]
    assert t.driver.executing == 1
    write = t.finished(jobs[0], now=0.8)
    assert [ids_of(c) for c in write] == [[1]]


def test_the_claim_riding_a_write_when_the_drain_starts():
    t, jobs = Trace.with_jobs(1, pool_size=4)
    write, ride = t.finished(jobs[0], now=0.5)
    assert t.drain(now=0.6) == []
    assert t.written(write, now=0.7) == []  # the claim behind it is still to come
    assert t.returned(*t.jobs.make(2), now=0.7) == [cmd.ReleaseJobs(lease_id=LEASE, job_ids=(2, 3)), RELEASE]


def test_failed_release_gives_up_and_stops():
    t, jobs = Trace.with_jobs(1)
    t.drain(timeout=2.0, now=1.0)
    t.tick(3.0)
    assert t.failed(RELEASE, now=3.1) == []
    assert t.driver.state is State.STOPPED
    assert t.driver.stats.abandoned == 1
    assert t.finished(jobs[0], now=4.0) == []


def test_failed_write_while_draining_is_retried_on_the_next_tick():
    t, jobs = Trace.with_jobs(1, poll_interval=1000.0)
    t.drain(timeout=100.0, now=1.0)
    (write,) = t.finished(jobs[0], now=2.0)
    assert t.failed(write, now=2.1) == []
    assert t.driver.state is State.DRAINING
    assert t.driver.unreported == 1
    again = t.tick_at_wakeup()
    assert again[0] == write
    assert t.written(write) == [RELEASE]


def test_failed_write_past_the_deadline_gives_up():
    t, jobs = Trace.with_jobs(2)
    t.drain(timeout=1.0, now=1.0)
    t.finished(jobs[0], now=1.5)
    (write,) = t.tick(2.0)
    assert t.failed(write, now=2.5) == []
    assert t.driver.state is State.STOPPED
    assert t.driver.next_wakeup() is None


def test_lost_lease_while_draining_stops_without_reopening():
    t, jobs = Trace.with_jobs(1, poll_interval=1000.0)
    t.drain(timeout=100.0, now=1.0)
    assert t.tick(10.0) == [cmd.RenewLease(lease_id=LEASE)]
    assert t.renewed(False, now=10.1) == []
    assert t.driver.state is State.STOPPED
    assert t.finished(jobs[0], now=11.0) == []


# ---- drain before the lease exists -------------------------------------------------------------


def test_drain_in_new_stops_at_once():
    t = Trace()
    assert t.drain(now=0.0) == []
    assert (t.driver.state, t.driver.next_wakeup()) == (State.STOPPED, None)


def test_drain_while_the_lease_is_being_opened_gives_the_new_lease_back():
    t = Trace()
    t.started(now=0.0)
    assert t.drain(now=0.5) == []
    assert (t.driver.state, t.driver.next_wakeup()) == (State.STOPPED, None)
    assert t.opened(LEASE, now=1.0) == [RELEASE]
    assert t.driver.state is State.DRAINING
    # The lease is brand new: the next wake-up is its heartbeat, not an instant in the past that
    # would make the driver fence itself and then refuse the LeaseReleased on its way.
    assert t.driver.next_wakeup() == pytest.approx(11.0)
    assert t.tick_at_wakeup() == [cmd.RenewLease(lease_id=LEASE)]
    assert t.lease_released(now=11.1) == []
    assert t.renewed(False, now=11.2) == []
    assert t.driver.state is State.STOPPED
    assert [c for _, cs in t.log for c in of_type(cs, cmd.ClaimJobs)] == []


def test_drain_after_a_failed_open_stops_and_expects_no_lease():
    t = Trace()
    t.started(now=0.0)
    t.failed(cmd.OpenLease(), now=0.1)
    assert t.drain(now=0.2) == []
    assert t.driver.state is State.STOPPED
    assert t.tick(5.0) == []
    with pytest.raises(InvalidEvent, match="no OpenLease is in flight"):
        t.opened(LEASE, now=5.1)


def test_open_failing_after_the_drain_started_just_stops():
    t = Trace()
    t.started(now=0.0)
    t.drain(now=0.1)
    assert t.failed(cmd.OpenLease(), now=0.2) == []
    assert (t.driver.state, t.driver.next_wakeup()) == (State.STOPPED, None)


def test_drain_while_reopening_after_a_lost_lease():
    t, jobs = Trace.with_jobs(1, poll_interval=1000.0)
    t.tick(10.0)
    assert t.renewed(False, now=10.1) == [cmd.OpenLease()]
    assert t.drain(now=10.2) == []
    assert t.opened(LEASE2, now=10.3) == [cmd.ReleaseLease(lease_id=LEASE2)]
    assert t.finished(jobs[0], now=10.4) == []  # abandoned with the first lease
    assert t.lease_released(now=10.5) == []
    assert t.driver.state is State.STOPPED


# ---- where the driver and its own transition table disagree (see the report) -------------------


def test_a_full_batch_is_written_while_draining():
    t, jobs = Trace.with_jobs(4, pool_size=4, max_outcome_batch=2)
    t.drain(timeout=100.0, now=1.0)
    assert t.finished(jobs[0], now=2.0) == []
    out = t.finished(jobs[1], now=3.0)
    assert [ids_of(c) for c in out] == [[1, 2]]


def test_a_lost_renewal_while_draining_swallows_the_results_still_in_flight():
    t, jobs = Trace.with_jobs(3, pool_size=4, max_outcome_batch=2, poll_interval=1000.0, maintenance_interval=1000.0)
    t.drain(timeout=5.0, now=5.0)
    assert t.finished(jobs[0], now=6.0) == []
    write, renew = t.tick(10.0)  # the deadline passes with two jobs running; heartbeat due too
    assert ids_of(write) == [1] and renew == cmd.RenewLease(lease_id=LEASE)
    (release,) = t.written({1}, now=10.0)  # queued before the RenewLease's answer is read
    assert release == cmd.ReleaseLease(lease_id=LEASE)
    assert t.renewed(False, now=10.0) == []
    assert t.driver.state is State.STOPPED
    assert t.lease_released(now=10.1) == []  # the stale answer is swallowed, not a halt
    assert t.driver.state is State.STOPPED


def test_a_failed_release_of_jobs_with_the_lease_release_behind_it_stops_cleanly():
    """The shell reports the ReleaseLease it did not run after the ReleaseJobs that failed: the
    second failure is the give-up's own stale result, not a reason to halt the pump."""
    t = Trace.running(pool_size=4)
    t.drain(now=0.1)
    a, b = t.jobs.make(2)
    release_jobs, release_lease = t.returned(a, b, now=0.2)
    assert release_lease == RELEASE
    assert t.failed(release_jobs, now=0.3) == []
    assert t.driver.state is State.STOPPED
    assert t.failed(release_lease, now=0.3) == []
    assert t.driver.state is State.STOPPED

"""Overruns in the Node Driver (core/overruns.py): a handler that outlives the attempt the driver
ended past its deadline is written flagged overrun, and forgotten once it returns."""

from __future__ import annotations

from backwave.core import commands as cmd
from backwave.core import events as ev

from .helpers import LEASE, LEASE2, Trace, of_type

SLOW = dict(poll_interval=100.0, maintenance_interval=1000.0, lease_duration=3000.0)


def _overrunning(pool_size=2, **options):
    """A pump running a job with a 1 s time limit beside a plain one, past the limit at 1.0."""
    t = Trace.running(pool_size=pool_size, **{**SLOW, **options})
    slow, other = t.jobs.make(1, timeout=1.0) + t.jobs.make(1)
    t.returned(slow, other, now=0.0)
    assert of_type(t.tick(now=1.0), cmd.StopAttempt)
    return t, slow, other


def _forget(*jobs):
    return cmd.ForgetOverruns(lease_id=LEASE, attempts=tuple((job.id, job.attempt) for job in jobs))


def test_a_handler_that_returns_before_its_outcome_is_written_leaves_no_overrun():
    t, slow, other = _overrunning()
    assert t.finished(slow, "failed", now=1.5) == []  # abandoned; its outcome still waits
    (write,) = of_type(t.finished(other, now=1.6), cmd.WriteOutcomes)
    assert [(o.job_id, o.overrun) for o in write.outcomes] == [(slow.id, False), (other.id, False)]
    t.written(write, now=1.7)
    assert not of_type(t.log[-1][1], cmd.ForgetOverruns)


def test_a_handler_that_returns_after_its_flagged_write_is_forgotten_behind_it():
    t, slow, other = _overrunning()
    (write,) = of_type(t.finished(other, now=1.1), cmd.WriteOutcomes)
    assert [(o.job_id, o.overrun) for o in write.outcomes] == [(slow.id, True), (other.id, False)]
    # The write is still in flight: the forget goes behind it, on the pump's one connection.
    assert t.finished(slow, "succeeded", now=1.2) == [_forget(slow)]
    t.written(write, now=1.3)
    assert t.send(ev.OverrunsForgotten(now=1.4, forgotten=1)) == []


def test_a_write_that_failed_goes_again_unflagged_and_its_overrun_is_still_forgotten():
    """The failed write may have committed (a lost reply): its overrun row may exist."""
    t, slow, other = _overrunning()
    (write,) = of_type(t.finished(other, now=1.1), cmd.WriteOutcomes)
    t.failed(write, now=1.2)
    assert t.finished(slow, now=1.3) == [_forget(slow)]
    (again,) = of_type(t.tick(now=200.0), cmd.WriteOutcomes)
    assert [(o.job_id, o.overrun) for o in again.outcomes] == [(slow.id, False), (other.id, False)]


def test_a_failed_forget_is_sent_again_after_its_backoff():
    t, slow, other = _overrunning()
    (write,) = of_type(t.finished(other, now=1.1), cmd.WriteOutcomes)
    t.written(write, now=1.2)
    (forget,) = t.finished(slow, now=2.0)
    assert t.failed(forget, now=2.1, jitter=0.5) == []
    retry_at = t.driver._overruns.not_before  # the fault's backoff (it starts from poll_interval)
    assert t.driver.next_wakeup() <= retry_at
    assert of_type(t.tick(now=retry_at - 0.01), cmd.ForgetOverruns) == []
    assert of_type(t.tick(now=retry_at), cmd.ForgetOverruns) == [forget]


def test_one_forget_in_flight_at_most_and_the_next_takes_what_returned_meanwhile():
    t = Trace.running(pool_size=3, **SLOW)
    first, second, third = t.jobs.make(2, timeout=1.0) + t.jobs.make(1)
    t.returned(first, second, third, now=0.0)
    t.tick(now=1.0)
    (write,) = of_type(t.finished(third, now=1.1), cmd.WriteOutcomes)
    t.written(write, now=1.2)
    assert t.finished(first, now=2.0) == [_forget(first)]
    assert t.finished(second, now=2.1) == []
    assert t.send(ev.OverrunsForgotten(now=2.2, forgotten=1)) == [_forget(second)]


def test_a_late_cancel_overruns_like_a_time_limit():
    t = Trace.running(pool_size=2, cancel_grace=1.0, **SLOW)
    stubborn, other = t.jobs.make(2)
    t.returned(stubborn, other, now=0.0)
    t.send(ev.CancelRequested(now=0.5, job_id=stubborn.id, by="api"))
    t.tick(now=1.5)
    (write,) = of_type(t.finished(other, now=1.6), cmd.WriteOutcomes)
    assert [(o.job_id, o.overrun) for o in write.outcomes] == [(stubborn.id, True), (other.id, False)]
    t.written(write, now=1.7)
    assert t.finished(stubborn, now=9.0) == [_forget(stubborn)]


def test_a_lost_lease_drops_the_overruns_and_the_forget_in_flight_is_stale():
    t, slow, other = _overrunning()
    (write,) = of_type(t.finished(other, now=1.1), cmd.WriteOutcomes)
    t.written(write, now=1.2)
    (forget,) = t.finished(slow, now=1.3)
    assert of_type(t.tick(now=1000.0), cmd.RenewLease)  # the heartbeat
    assert t.renewed(held=False, now=1001.0) == [cmd.OpenLease()]
    assert t.send(ev.OverrunsForgotten(now=1001.1, forgotten=0)) == []  # swallowed: sent under the old lease
    t.opened(LEASE2, now=1001.2)
    assert of_type(t.log[-1][1], cmd.ForgetOverruns) == []


def test_a_handler_that_returns_after_its_lease_was_lost_sends_nothing():
    t, slow, other = _overrunning()
    (write,) = of_type(t.finished(other, now=1.1), cmd.WriteOutcomes)
    t.written(write, now=1.2)
    assert of_type(t.tick(now=1000.0), cmd.RenewLease)
    t.renewed(held=False, now=1001.0)
    t.opened(LEASE2, now=1001.2)
    assert of_type(t.finished(slow, now=1002.0), cmd.ForgetOverruns) == []


def test_a_draining_pump_forgets_its_overruns_too():
    t, slow, other = _overrunning()
    (write,) = of_type(t.finished(other, now=1.1), cmd.WriteOutcomes)
    t.written(write, now=1.2)
    t.drain(timeout=30.0, now=1.3)
    assert of_type(t.finished(slow, now=1.4), cmd.ForgetOverruns) == [_forget(slow)]

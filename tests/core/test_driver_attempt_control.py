"""Attempt control in the Node Driver: time limits, cancels, snoozes, discards and a task's own
backoff, as protocol traces (events in, commands out, the trace's clock only)."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.jobs import OutcomeKind
from backwave.core.transitions import InvalidEvent

from .helpers import LEASE, Trace, claim, internals, of_type


def _cancel(t: Trace, job_id: int, by: str = "admin:alice", now=None):
    return t.send(ev.CancelRequested(now=t._now(now), job_id=job_id, by=by))


def _finished(t: Trace, job, result, *, delay=None, now=None, jitter=0.0):
    return t.send(ev.JobFinished(now=t._now(now), job_id=job.id, attempt=job.attempt, result=result, delay=delay, jitter=jitter))


def test_an_attempt_with_a_time_limit_wakes_the_driver_at_its_deadline():
    t = Trace.running(pool_size=4, poll_interval=100.0, maintenance_interval=1000.0, lease_duration=3000.0)
    (job,) = t.jobs.make(1, timeout=2.5)
    t.returned(job, now=1.0)
    assert t.driver.next_wakeup() == 3.5


def test_a_timed_out_attempt_is_retried_under_its_rules_and_keeps_its_slot_until_the_handler_returns():
    t = Trace.running(pool_size=2, poll_interval=100.0, maintenance_interval=1000.0, lease_duration=3000.0)
    slow, other = t.jobs.make(1, timeout=2.0) + t.jobs.make(1)
    t.returned(slow, other, now=0.0)
    assert t.tick(now=1.9) == []  # not yet
    out = t.tick(now=2.0)
    assert out == [cmd.StopAttempt(job_id=slow.id, attempt=1, reason="timeout")]  # other still runs: buffered
    assert t.driver.free_slots == 0  # its outcome is buffered and its handler still runs
    out = _finished(t, other, "succeeded", now=2.1)
    (write,) = of_type(out, cmd.WriteOutcomes)
    timeout = next(o for o in write.outcomes if o.job_id == slow.id)
    assert timeout.kind is OutcomeKind.RETRY and timeout.reason == "timeout" and timeout.overrun
    assert timeout.retry_delay == pytest.approx(2.0 * 0.75)  # backoff_base 2, the nominal draw
    assert of_type(out, cmd.ClaimJobs) == [claim(1)]  # the abandoned handler still holds a thread
    t.written(write, now=2.2)
    t.returned(now=2.2)
    assert t.driver.free_slots == 1
    # Its late report is an abandoned attempt's: no outcome, and its handler counts no more.
    assert _finished(t, slow, "failed", now=5.0) == [cmd.ForgetOverruns(lease_id=LEASE, attempts=((slow.id, 1),))]
    assert t.driver.free_slots == 2


def test_a_timed_out_last_attempt_fails_the_job():
    t = Trace.running(pool_size=1, poll_interval=100.0, maintenance_interval=1000.0, lease_duration=3000.0)
    (job,) = t.jobs.make(1, timeout=1.0, attempt=3, max_attempts=3)
    t.returned(job, now=0.0)
    out = t.tick(now=1.0)
    assert out[0] == cmd.StopAttempt(job_id=job.id, attempt=3, reason="timeout")
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert [(o.kind, o.reason) for o in write.outcomes] == [(OutcomeKind.FAILED, "timeout")]


def test_a_cancel_stops_the_handler_and_ends_the_attempt_cancelled_when_it_returns():
    t, (job,) = Trace.with_jobs(1, pool_size=4)
    assert _cancel(t, job.id, now=0.5) == [cmd.StopAttempt(job_id=job.id, attempt=1, reason="cancelled by admin:alice")]
    assert _cancel(t, job.id, now=0.6) == []  # noted once (the NOTIFY and the heartbeat both tell)
    out = _finished(t, job, "succeeded", now=0.7)  # however it ends, it was cancelled
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert [(o.kind, o.reason) for o in write.outcomes] == [(OutcomeKind.CANCELLED, "cancelled by admin:alice")]


def test_a_cancel_the_handler_ignores_ends_the_attempt_after_the_grace_like_a_timeout():
    t = Trace.running(pool_size=4, cancel_grace=3.0, poll_interval=100.0, maintenance_interval=1000.0, lease_duration=3000.0)
    (job,) = t.jobs.make(1)
    t.returned(job, now=0.0)
    _cancel(t, job.id, now=1.0)
    assert t.driver.next_wakeup() == 4.0
    out = t.tick(now=4.0)
    assert out[0].reason.startswith("cancelled by admin:alice")
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert write.outcomes[0].kind is OutcomeKind.CANCELLED
    assert "did not stop in time" in write.outcomes[0].reason


def test_a_cancel_of_a_job_this_pump_does_not_run_changes_nothing():
    t, _jobs = Trace.with_jobs(1, pool_size=4)
    before = internals(t.driver)
    assert _cancel(t, 999) == []
    assert internals(t.driver) == before


def test_a_job_claimed_with_a_cancel_pending_is_cancelled_without_running():
    t = Trace.running(pool_size=4)
    (job,) = t.jobs.make(1, cancel_requested_by="api", attempt=2)
    out = t.returned(job, now=0.1)
    assert of_type(out, cmd.ExecuteJob) == []
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert write.outcomes[0].kind is OutcomeKind.CANCELLED
    assert write.outcomes[0].reason == "cancelled by api (before this attempt started)"


def test_a_snooze_is_ready_again_after_its_delay_and_a_discard_fails_at_once():
    t, (snoozing, discarding) = Trace.with_jobs(2, pool_size=4)
    assert _finished(t, snoozing, "snoozed", delay=30.0, now=0.1) == []
    out = _finished(t, discarding, "discarded", now=0.2)
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert [(o.kind, o.retry_delay) for o in write.outcomes] == [(OutcomeKind.SNOOZED, 30.0), (OutcomeKind.FAILED, None)]


def test_a_failure_with_a_task_backoff_waits_what_the_task_said():
    t, (job,) = Trace.with_jobs(1, pool_size=4)
    out = _finished(t, job, "failed", delay=7.0, now=0.1)
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert [(o.kind, o.retry_delay) for o in write.outcomes] == [(OutcomeKind.RETRY, 7.0)]


def test_a_delay_past_the_maximum_is_cut_to_it_and_stays_a_retry():
    """A task's backoff() or a snooze answering 1e15 s: past any date the store holds."""
    from backwave.core.backoff import MAX_DELAY

    t, (failing, snoozing) = Trace.with_jobs(2, pool_size=4)
    assert _finished(t, failing, "failed", delay=1e15, now=0.1) == []
    out = _finished(t, snoozing, "snoozed", delay=MAX_DELAY * 2, now=0.2)
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert [(o.kind, o.retry_delay) for o in write.outcomes] == [(OutcomeKind.RETRY, MAX_DELAY), (OutcomeKind.SNOOZED, MAX_DELAY)]


def test_a_job_enqueued_with_a_huge_backoff_max_retries_within_the_maximum():
    """A row written before backoff_max had a bound, retried by the default backoff."""
    from backwave.core.backoff import MAX_DELAY

    t = Trace.running(pool_size=1, poll_interval=100.0, maintenance_interval=1e6, lease_duration=3000.0)
    (job,) = t.jobs.make(1, attempt=60, max_attempts=100, backoff_base=1.0, backoff_max=1e300)
    t.returned(job, now=0.0)
    (write,) = of_type(t.finished(job, "failed", jitter=0.999, now=0.1), cmd.WriteOutcomes)
    assert write.outcomes[0].kind is OutcomeKind.RETRY and MAX_DELAY / 2 <= write.outcomes[0].retry_delay <= MAX_DELAY


@pytest.mark.parametrize(("result", "delay"), [("snoozed", None), ("failed", -1.0), ("snoozed", float("nan")), ("failed", "3")])
def test_a_bad_delay_is_refused_and_changes_nothing(result, delay):
    t, (job,) = Trace.with_jobs(1, pool_size=4)
    before = internals(t.driver)
    with pytest.raises(InvalidEvent, match="delay"):
        _finished(t, job, result, delay=delay)
    assert internals(t.driver) == before


def test_a_drain_does_not_wait_for_an_attempt_past_its_deadline():
    t = Trace.running(pool_size=2, poll_interval=100.0, maintenance_interval=1000.0, lease_duration=3000.0)
    (job,) = t.jobs.make(1, timeout=2.0)
    t.returned(job, now=0.0)
    t.drain(timeout=60.0, now=1.0)
    out = t.tick(now=2.0)
    assert out[0] == cmd.StopAttempt(job_id=job.id, attempt=1, reason="timeout")
    (write,) = of_type(out, cmd.WriteOutcomes)
    assert write.outcomes[0].kind is OutcomeKind.RETRY
    assert t.written(write, now=2.1) == [cmd.ReleaseLease(lease_id=LEASE)]


def test_the_heartbeats_cancels_are_noted_as_if_heard():
    t, (job, other) = Trace.with_jobs(2, pool_size=4)
    renewals = []
    while not renewals:
        renewals = of_type(t.tick_at_wakeup(), cmd.RenewLease)
    out = t.send(ev.LeaseRenewed(now=t.now, held=True, cancels=((job.id, "api"), (999, "api"))))
    assert out == [cmd.StopAttempt(job_id=job.id, attempt=1, reason="cancelled by api")]

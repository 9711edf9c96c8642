"""Lifecycle: NEW -> OPENING -> RUNNING, and every event the table refuses, refused cleanly."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import InvalidEvent, NodeDriver, State
from backwave.core.policy import Strict

from .helpers import MAINTENANCE, LEASE, Trace, claim, execute, internals, make_options, observable


def test_new_driver_waits_for_started():
    driver = NodeDriver(make_options())
    assert driver.state is State.NEW
    assert driver.lease_id is None
    assert driver.next_wakeup() is None
    assert (driver.executing, driver.unreported, driver.free_slots) == (0, 0, 20)


def test_started_opens_a_lease():
    t = Trace()
    assert t.started() == [cmd.OpenLease()]
    assert t.driver.state is State.OPENING
    assert t.driver.next_wakeup() is None  # the OpenLease is in flight: nothing to time


@pytest.mark.parametrize(("pool", "batch", "limit"), [(20, 32, 20), (20, 8, 8), (1, 32, 1), (5, 5, 5)])
def test_lease_opened_claims_and_runs_maintenance_at_once(pool, batch, limit):
    t = Trace(pool_size=pool, max_claim_batch=batch)
    t.started()
    assert t.opened(LEASE, now=0.5) == [claim(limit), *MAINTENANCE]
    assert t.driver.state is State.RUNNING
    assert t.driver.lease_id == LEASE
    assert t.driver.free_slots == pool - limit  # the claim in flight holds its slots


def test_claims_name_the_policy_queues_in_order():
    t = Trace(policy=Strict("high", "low"))
    t.started()
    assert t.opened()[0] == cmd.ClaimJobs(lease_id=LEASE, queues=("high", "low"), limit=20)


def test_first_wakeups_after_opening():
    t = Trace.running(poll_interval=2.0, lease_duration=30.0, maintenance_interval=60.0)
    # Poll is due at once (a claim is in flight); heartbeat at 10; trust until 27; maintenance 60.
    t.returned(now=0.2)  # short claim: next poll at 0.2 + 2
    assert t.driver.next_wakeup() == pytest.approx(2.2)
    assert t.tick(2.2) == [claim(20)]


def test_failed_open_is_retried_after_poll_interval():
    t = Trace(poll_interval=3.0)
    t.started(now=1.0)
    assert t.failed(cmd.OpenLease(), now=1.5) == []
    assert t.driver.state is State.OPENING
    assert t.driver.next_wakeup() == 4.5
    assert t.tick(4.0) == []  # early: nothing
    assert t.tick(4.5) == [cmd.OpenLease()]
    assert t.driver.next_wakeup() is None
    assert t.tick(9.0) == []  # in flight: a stray tick does nothing
    assert t.opened(LEASE, now=9.1) == [claim(20), *MAINTENANCE]
    assert t.driver.stats.store_faults == 1


def test_a_whole_conversation_round_trip():
    t = Trace.running(pool_size=2, max_claim_batch=2)
    a, b = t.jobs.make(2)
    assert t.returned(a, b, now=0.1) == execute(a, b)  # full, but no room left: no re-claim
    assert t.finished(a, now=1.0) == []
    out = t.finished(b, now=2.0)
    assert [type(c) for c in out] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert [o.job_id for o in out[0].outcomes] == [1, 2]
    assert out[1] == claim(2)
    assert t.written({1, 2}, now=2.1) == []
    assert t.returned(now=2.2) == []
    assert t.driver.stats.claims == 2
    assert t.driver.stats.claimed == 2
    assert t.driver.stats.writes == 1
    assert t.driver.stats.applied == 2
    assert t.driver.unreported == 0


# ---- the illegal (state, event) pairs -----------------------------------------------------------


def _job_event(job_id=999):
    return ev.JobFinished(now=50.0, job_id=job_id, attempt=1, result="succeeded")


SAMPLE_EVENTS = {
    ev.Started: lambda: ev.Started(now=50.0),
    ev.LeaseOpened: lambda: ev.LeaseOpened(now=50.0, lease_id=uuid.UUID(int=77)),
    ev.Tick: lambda: ev.Tick(now=50.0),
    ev.HintReceived: lambda: ev.HintReceived(now=50.0),
    ev.ClaimReturned: lambda: ev.ClaimReturned(now=50.0, jobs=()),
    ev.JobFinished: _job_event,
    ev.OutcomesWritten: lambda: ev.OutcomesWritten(now=50.0, applied=frozenset()),
    ev.LeaseRenewed: lambda: ev.LeaseRenewed(now=50.0, held=True),
    ev.LeasesExpired: lambda: ev.LeasesExpired(now=50.0, released=0),
    ev.SchedulesMinted: lambda: ev.SchedulesMinted(now=50.0, minted=0),
    ev.PumpsPurged: lambda: ev.PumpsPurged(now=50.0, purged=0),
    ev.JobsReleased: lambda: ev.JobsReleased(now=50.0, released=frozenset()),
    ev.LeaseReleased: lambda: ev.LeaseReleased(now=50.0),
    ev.StoreFailed: lambda: ev.StoreFailed(now=50.0, command=cmd.OpenLease()),
    ev.DrainRequested: lambda: ev.DrainRequested(now=50.0, timeout=5.0),
}

# The transition table, as the states each event type is accepted in (preconditions aside).
ACCEPTED = {
    ev.Started: {State.NEW},
    ev.LeaseOpened: {State.OPENING, State.STOPPED},
    ev.Tick: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.HintReceived: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.ClaimReturned: {State.RUNNING, State.DRAINING},
    ev.JobFinished: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.OutcomesWritten: {State.OPENING, State.RUNNING, State.DRAINING},
    ev.LeaseRenewed: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.LeasesExpired: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.SchedulesMinted: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.PumpsPurged: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.JobsReleased: {State.RUNNING, State.DRAINING},
    ev.LeaseReleased: {State.DRAINING},
    ev.StoreFailed: {State.OPENING, State.RUNNING, State.DRAINING, State.STOPPED},
    ev.DrainRequested: set(State),
}


def _in_new():
    return Trace()


def _in_opening():
    t = Trace()
    t.started()
    return t


def _in_running():
    t, jobs = Trace.with_jobs(3, pool_size=4, max_claim_batch=4)  # short claim: nothing in flight
    t.finished(jobs[0], now=0.2)  # one outcome buffered, two executing
    return t


def _in_draining():
    t = _in_running()
    assert t.drain(timeout=100.0, now=0.3) == []
    return t


def _in_stopped():
    t, jobs = Trace.with_jobs(1)
    t.finished(jobs[0], now=0.2)
    t.written({jobs[0].id}, now=0.3)
    t.returned(now=0.3)  # the claim that rode the write
    assert t.drain(now=0.4) == [cmd.ReleaseLease(lease_id=LEASE)]
    assert t.lease_released(now=0.5) == []
    assert t.driver.state is State.STOPPED
    return t


IN_STATE = {
    State.NEW: _in_new,
    State.OPENING: _in_opening,
    State.RUNNING: _in_running,
    State.DRAINING: _in_draining,
    State.STOPPED: _in_stopped,
}

ILLEGAL_PAIRS = [(state, kind) for state in State for kind in SAMPLE_EVENTS if state not in ACCEPTED[kind]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Mystery(ev.Event):
    """An event type the driver has never heard of."""


def _assert_refused(t: Trace, event: ev.Event, *, reason: str = ""):
    state = t.driver.state
    before, before_all = observable(t.driver), internals(t.driver)
    with pytest.raises(InvalidEvent) as caught:
        t.driver.handle(event)
    message = str(caught.value)
    assert type(event).__name__ in message
    assert f"state {state.value}" in message
    assert reason in message
    assert caught.value.event is event
    assert caught.value.state is state
    assert observable(t.driver) == before
    assert internals(t.driver) == before_all


def test_every_state_has_a_builder_and_the_illegal_table_is_not_empty():
    for state, build in IN_STATE.items():
        assert build().driver.state is state
    # NEW refuses all but DrainRequested (14); OPENING 4; RUNNING 3; DRAINING 2; STOPPED 4.
    assert len(ILLEGAL_PAIRS) == 27


@pytest.mark.parametrize(("state", "kind"), ILLEGAL_PAIRS, ids=lambda x: getattr(x, "__name__", getattr(x, "value", x)))
def test_illegal_event_raises_and_changes_nothing(state, kind):
    _assert_refused(IN_STATE[state](), SAMPLE_EVENTS[kind]())


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
def test_unknown_event_type_is_refused_in_every_state(state):
    _assert_refused(IN_STATE[state](), Mystery(now=1.0), reason="unknown event type")


def _opening_after_failed_open():
    t = _in_opening()
    t.failed(cmd.OpenLease(), now=0.1)
    return t


def _stopped_from_new():
    t = Trace()
    t.drain(now=0.0)
    return t


PRECONDITION_CASES = {
    "lease opened with no open in flight": (
        _opening_after_failed_open,
        lambda t: ev.LeaseOpened(now=1, lease_id=LEASE),
        "no OpenLease is in flight",
    ),
    "lease opened in STOPPED with no open in flight": (
        _stopped_from_new,
        lambda t: ev.LeaseOpened(now=1, lease_id=LEASE),
        "no OpenLease is in flight",
    ),
    "claim returned with no claim in flight": (
        _in_running,
        lambda t: ev.ClaimReturned(now=1, jobs=()),
        "no ClaimJobs is in flight",
    ),
    "claim returned in DRAINING with no claim in flight": (
        _in_draining,
        lambda t: ev.ClaimReturned(now=1, jobs=()),
        "no ClaimJobs",
    ),
    "job finished that never ran": (_in_running, lambda t: _job_event(424242), "job 424242 is not executing"),
    "job finished with the wrong attempt": (
        _in_running,
        lambda t: ev.JobFinished(now=1, job_id=2, attempt=2, result="failed"),
        "runs attempt 1, not 2",
    ),
    "job finished with an unknown result": (
        _in_running,
        lambda t: ev.JobFinished(now=1, job_id=2, attempt=1, result="exploded"),
        "unknown result 'exploded'",
    ),
    # Jitter is the shell's draw; out of range, a failed attempt's backoff cannot be decided.
    "job finished with jitter out of range": (
        _in_running,
        lambda t: ev.JobFinished(now=1, job_id=2, attempt=1, result="failed", jitter=1.0),
        "jitter must be in [0, 1)",
    ),
    "job finished in OPENING that never ran": (_in_opening, lambda t: _job_event(5), "not executing"),
    "outcomes written with no write in flight": (
        _in_running,
        lambda t: ev.OutcomesWritten(now=1, applied=frozenset()),
        "no WriteOutcomes is in flight",
    ),
    "lease renewed with no renew in flight": (
        _in_running,
        lambda t: ev.LeaseRenewed(now=1, held=True),
        "no RenewLease is in flight",
    ),
    "lease renewed in STOPPED with no renew in flight": (
        _in_stopped,
        lambda t: ev.LeaseRenewed(now=1, held=False),
        "accepted only in RUNNING, DRAINING",
    ),
    "lease released with no release in flight": (_in_draining, lambda t: ev.LeaseReleased(now=1), "no ReleaseLease is in flight"),
    "store failed for something that is not a command": (
        _in_running,
        lambda t: ev.StoreFailed(now=1, command="ClaimJobs"),
        "unknown command 'ClaimJobs'",
    ),
}


@pytest.mark.parametrize("case", list(PRECONDITION_CASES))
def test_event_without_its_precondition_raises_and_changes_nothing(case):
    build, make_event, reason = PRECONDITION_CASES[case]
    t = build()
    _assert_refused(t, make_event(t), reason=reason)


def test_the_driver_keeps_working_after_a_refused_event():
    t = _in_running()
    with pytest.raises(InvalidEvent):
        t.driver.handle(ev.OutcomesWritten(now=1.0, applied=frozenset()))
    out = t.tick(1.5)  # poll due: claim the free slot, write the buffered outcome
    assert [type(c) for c in out] == [cmd.ClaimJobs, cmd.WriteOutcomes]
    assert out[0].limit == 1


def test_store_failed_for_a_command_not_in_flight_is_refused():
    t = _in_running()
    _assert_refused(t, ev.StoreFailed(now=1.0, command=cmd.OpenLease()), reason="OpenLease")

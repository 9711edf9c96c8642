"""How the pump thread takes its events: what it asks the driver per event (counts, no timing)."""

from __future__ import annotations

from backwave.core import events as ev
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.shell.pump import Pump
from backwave.tasking.registry import TaskRegistry


def _unstarted_pump() -> Pump:
    options = WorkerGroupOptions(name="events", policy=Strict("e2e"), pool_size=2, max_claim_batch=2)
    return Pump(options, 0, store_factory=lambda: None, registry=TaskRegistry())


def test_a_busy_pump_asks_the_driver_when_to_wake_only_before_it_would_wait():
    pump = _unstarted_pump()
    asked = []
    next_wakeup = pump.driver.next_wakeup
    pump.driver.next_wakeup = lambda: asked.append(1) or next_wakeup()
    queued = [ev.Tick(now=float(n)) for n in range(5)]
    for event in queued:
        pump._channel.put(event)

    taken = [pump._next_event() for _ in queued]

    assert taken == queued
    # Each of these found an event waiting, so no wait and no timeout to compute; a finished
    # job is such an event on a busy pump, and next_wakeup asks every part of the driver.
    assert asked == []


def test_a_pump_with_nothing_waiting_waits_until_the_drivers_next_wakeup():
    pump = _unstarted_pump()
    asked = []
    pump.driver.next_wakeup = lambda: asked.append(1) or 0.0  # due now: the wait times out at once

    event = pump._next_event()

    assert isinstance(event, ev.Tick)
    assert asked == [1]


def test_the_finished_jobs_at_the_head_of_the_channel_are_taken_and_the_first_other_event_comes_next():
    """What _arrived hands the executor while a store call's answer waits: the finished jobs
    that came in meanwhile, up to the first event of another kind, which stays next in line so
    the order of everything else is kept."""
    pump = _unstarted_pump()
    finished = [ev.JobFinished(now=float(n), job_id=n, attempt=1, result="succeeded") for n in range(3)]
    hint = ev.HintReceived(now=9.0)
    pump._hint_flag.raise_()
    for event in (finished[0], finished[1], hint, finished[2]):
        pump._channel.put(event)

    assert pump._arrived() == finished[:2]
    assert pump._arrived() == []  # the hint waits at the head: nothing passes it
    assert pump._next_event() is hint
    assert pump._hint_flag.raise_(), "the hint was taken from the channel, so its flag is down"
    assert pump._arrived() == [finished[2]]
    assert pump._channel.empty()

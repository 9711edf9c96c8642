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

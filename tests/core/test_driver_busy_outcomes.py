"""Busy outcomes (******* in core/transitions.py): a write that comes back with outcomes whose job
rows another transaction held. The rest of the batch landed; the busy ones keep their slots, are
neither applied nor lost, and go again in the first write after poll_interval."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core.transitions import InvalidEvent

from .helpers import Trace, ids_of, of_type


def test_a_busy_outcome_waits_poll_interval_while_the_rest_of_its_batch_lands():
    t, jobs = Trace.with_jobs(3, pool_size=3, poll_interval=1.0)
    t.finished(jobs[0], now=0.1)
    t.finished(jobs[1], now=0.1)
    (write, *_) = t.finished(jobs[2], now=0.1)
    assert ids_of(write) == [1, 2, 3]
    out = t.written(write, now=0.2, busy=[2])
    assert of_type(out, cmd.WriteOutcomes) == []  # not written again at once, idle pool or not
    assert t.driver.stats.applied == 2 and t.driver.stats.busy == 1 and t.driver.stats.lost == 0
    assert t.driver.unreported == 1  # its slot stays taken: the job still runs by the database
    assert t.driver.next_wakeup() <= 1.2
    assert of_type(t.tick(1.0), cmd.WriteOutcomes) == []
    (again,) = of_type(t.tick(1.2), cmd.WriteOutcomes)
    assert ids_of(again) == [2]
    assert t.written(again, now=1.3) is not None
    assert t.driver.unreported == 0 and t.driver.stats.applied == 3


def test_outcomes_finished_meanwhile_are_written_without_waiting_for_a_busy_one():
    t, jobs = Trace.with_jobs(2, pool_size=2, poll_interval=1.0, max_outcome_batch=1)
    (write, *_) = t.finished(jobs[0], now=0.1)
    t.written(write, now=0.2, busy=[1])
    t.returned(now=0.25)  # the claim that rode the write: nothing more
    (out,) = of_type(t.finished(jobs[1], now=0.3), cmd.WriteOutcomes)
    assert ids_of(out) == [2]  # the busy one is not due yet: it stays behind
    t.written(out, now=0.4)
    t.returned(now=0.45)
    assert of_type(t.tick(1.0), cmd.WriteOutcomes) == []
    assert t.driver.next_wakeup() == pytest.approx(1.45)  # the next poll, past its due time: it carries it
    (again,) = of_type(t.tick(1.45), cmd.WriteOutcomes)
    assert ids_of(again) == [1]


def test_a_busy_id_must_be_one_of_the_write_and_not_applied():
    t, jobs = Trace.with_jobs(1, pool_size=1)
    (write, *_) = t.finished(jobs[0], now=0.1)
    with pytest.raises(InvalidEvent, match="busy ids"):
        t.written([1], now=0.2, busy=[1])
    with pytest.raises(InvalidEvent, match="busy ids"):
        t.written([], now=0.2, busy=[7])


def test_draining_a_busy_outcome_is_retried_until_the_deadline_then_goes_with_the_lease():
    t, jobs = Trace.with_jobs(1, pool_size=1, poll_interval=1.0)
    t.drain(timeout=5.0, now=0.0)
    (write,) = of_type(t.finished(jobs[0], now=0.1), cmd.WriteOutcomes)
    assert t.written(write, now=0.2, busy=[1]) == []
    (again,) = of_type(t.tick(1.2), cmd.WriteOutcomes)
    assert t.written(again, now=1.3, busy=[1]) == []
    (last,) = of_type(t.tick(5.1), cmd.WriteOutcomes)  # due again, past the deadline: one more try
    assert of_type(t.written(last, now=5.2, busy=[1]), cmd.ReleaseLease)


def test_a_claim_sized_for_outcomes_that_came_back_busy_is_taken():
    # The claim riding a write is sized as if the write's outcomes all landed: when some come back
    # busy, their slots stay taken and the claim's full answer holds that many jobs more than the
    # pool and the room ahead. Refusing it halted the pump (a fan-in on a real worker, two pumps
    # settling one dependent: "backpressure violated: 96 unreported + 4 claimed > pool_size 4 + 92 ahead").
    t, jobs = Trace.with_jobs(2, pool_size=2, poll_interval=1.0, claim_ahead=0)
    t.finished(jobs[0], now=0.1)
    commands = t.finished(jobs[1], now=0.1)
    (write,) = of_type(commands, cmd.WriteOutcomes)
    (riding,) = of_type(commands, cmd.ClaimJobs)
    assert riding.limit == 2
    t.written(write, now=0.2, busy=[1, 2])
    t.returned(*t.jobs.make(2), now=0.2)  # no InvalidEvent
    assert t.driver.unreported == 4
    assert of_type(t.tick(0.5), cmd.ClaimJobs) == []  # over the pool until the busy ones land
    (again,) = of_type(t.tick(1.2), cmd.WriteOutcomes)
    assert ids_of(again) == [1, 2]

"""Outcomes: what a finished attempt turns into, how outcomes buffer, and when they are written."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.backoff import retry_delay
from backwave.core.jobs import Outcome, OutcomeKind
from backwave.core.transitions import InvalidEvent

from .helpers import LEASE, Trace, claim, execute, ids_of


def test_outcomes_buffer_until_nothing_executes_then_write_and_claim_as_if_written():
    t, jobs = Trace.with_jobs(3, pool_size=4)
    assert t.finished(jobs[1], now=0.5) == []
    assert t.finished(jobs[2], now=0.6) == []
    assert t.driver.unreported == 3  # finished-but-unreported jobs keep their slots
    assert t.driver.free_slots == 1
    out = t.finished(jobs[0], now=0.7)
    # Why claim(4) and not claim(1): the shell runs (or pipelines) the claim after the write, so
    # by the time the claim runs the written outcomes have released their slots. Sizing it on the
    # pre-write free capacity would cost an extra round-trip per batch at steady state.
    assert out == [
        cmd.WriteOutcomes(
            lease_id=LEASE,
            outcomes=tuple(Outcome(job_id=j.id, attempt=1, kind=OutcomeKind.SUCCEEDED) for j in (jobs[1], jobs[2], jobs[0])),
        ),
        claim(4),
    ]
    assert t.written(out[0], now=0.8) == []  # the claim rode the write: no second re-poll
    fresh = t.jobs.make(4)
    assert t.returned(*fresh, now=0.8) == execute(*fresh)  # four jobs fit once the write landed


def test_a_full_batch_is_written_at_once():
    t, jobs = Trace.with_jobs(5, pool_size=10, max_outcome_batch=2)
    assert t.finished(jobs[0], now=0.1) == []
    out = t.finished(jobs[1], now=0.2)
    assert [type(c) for c in out] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert ids_of(out[0]) == [1, 2]
    assert out[1] == claim(10 - 3)


def test_the_outcome_batch_falls_back_to_max_claim_batch():
    t = Trace.running(pool_size=10, max_claim_batch=2)
    first = t.jobs.make(2)
    assert t.returned(*first, now=0.1) == execute(*first) + [claim(2)]
    second = t.jobs.make(2)
    assert t.returned(*second, now=0.1) == execute(*second) + [claim(2)]
    third = t.jobs.make(1)
    assert t.returned(*third, now=0.1) == execute(*third)
    assert t.finished(first[0], now=0.2) == []
    out = t.finished(first[1], now=0.3)
    assert ids_of(out[0]) == [1, 2]
    assert out[1] == claim(2)  # min(10 - 3 executing, max_claim_batch 2)


def test_a_poll_tick_sizes_its_claim_before_the_buffer_drains():
    t, jobs = Trace.with_jobs(3, pool_size=5, poll_interval=1.0)
    t.finished(jobs[0], now=0.5)
    out = t.tick(1.0)
    # 5 - 2 executing - 1 buffered = 2, not 3: the claim runs before the write, so the buffered
    # outcome still holds its lease and its slot. And the claim comes first in the list.
    assert out == [
        claim(2),
        cmd.WriteOutcomes(lease_id=LEASE, outcomes=(Outcome(job_id=1, attempt=1, kind=OutcomeKind.SUCCEEDED),)),
    ]


def test_a_poll_tick_with_a_full_pool_only_writes():
    t, jobs = Trace.with_jobs(3, pool_size=3, poll_interval=1.0)
    t.finished(jobs[0], now=0.5)
    out = t.tick(1.0)
    assert [type(c) for c in out] == [cmd.WriteOutcomes]
    assert t.written(out[0], now=1.1) == [claim(1)]  # the landed write re-polls for the slot


def test_only_one_write_is_in_flight():
    t, jobs = Trace.with_jobs(3, pool_size=10, max_outcome_batch=1)
    first = t.finished(jobs[0], now=0.1)
    assert ids_of(first[0]) == [1] and first[1] == claim(8)
    assert t.finished(jobs[1], now=0.2) == []  # batch full, but a write is in flight
    assert t.finished(jobs[2], now=0.3) == []  # nothing executes, but a write is in flight
    assert t.driver.unreported == 3
    assert t.written({1}, now=0.4) == []  # the claim that rode it is still in flight
    second = t.returned(now=0.5)  # its answer: the next write goes, a claim riding it
    assert [type(c) for c in second] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert ids_of(second[0]) == [2] and second[1] == claim(9)
    assert t.written({2}, now=0.6) == []
    third = t.returned(now=0.7)
    assert [type(c) for c in third] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert ids_of(third[0]) == [3] and third[1] == claim(10)
    writes = [c for _, cs in t.log for c in cs if isinstance(c, cmd.WriteOutcomes)]
    assert [ids_of(w) for w in writes] == [[1], [2], [3]]


def test_a_write_due_while_a_claim_is_in_flight_waits_for_its_answer_and_carries_the_next_claim():
    # Two halves of a pool in step (sleeping jobs): the second half finishes while the first
    # half's write and claim are in flight. Written at once when that write lands, its outcomes
    # would go alone (the claim is still in flight), and the claim for their slots would follow
    # on a round-trip of its own. Held until the claim's answer, they carry that claim.
    t = Trace.running(pool_size=4, max_claim_batch=2)
    first = t.jobs.make(2)
    assert t.returned(*first, now=0.1) == execute(*first) + [claim(2)]
    second = t.jobs.make(2)
    assert t.returned(*second, now=0.1) == execute(*second)
    t.finished(first[0], now=0.2)
    write, ride = t.finished(first[1], now=0.2)
    assert ids_of(write) == [1, 2] and ride == claim(2)
    assert t.finished(second[0], now=0.21) == []  # a write is in flight
    assert t.finished(second[1], now=0.21) == []
    assert t.written(write, now=0.22) == []  # due, but the claim that rode it has not answered
    third = t.jobs.make(2)
    out = t.returned(*third, now=0.22)
    assert out[:2] == execute(*third)
    assert [type(c) for c in out[2:]] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert ids_of(out[2]) == [3, 4] and out[3] == claim(2)
    assert t.written(out[2], now=0.23) == []  # the claim rode the write: no lone re-poll
    assert t.driver.stats.writes == 2 and t.driver.stats.claims == 3


def test_a_write_that_waited_for_a_claim_that_failed_goes_with_the_claim_s_retry():
    t = Trace.running(pool_size=2, max_claim_batch=1, poll_interval=1.0)
    (job,) = t.jobs.make(1)
    _, pending_claim = t.returned(job, now=0.1)
    assert t.finished(job, now=0.2) == []
    assert t.failed(pending_claim, now=0.3) == []
    retry_at = t.driver.next_wakeup()
    assert retry_at > 0.3
    again = t.tick(retry_at)
    assert [type(c) for c in again] == [cmd.ReconcileLease, cmd.WriteOutcomes]
    assert ids_of(again[1]) == [job.id]


def test_ids_the_fence_refused_are_lost_and_free_their_slots():
    t, jobs = Trace.with_jobs(3, pool_size=4)
    t.finished(jobs[0], now=0.1)
    t.finished(jobs[1], now=0.2)
    write, ride = t.finished(jobs[2], now=0.3)
    assert t.written({1, 3}, now=0.4) == []
    assert (t.driver.stats.writes, t.driver.stats.applied, t.driver.stats.lost) == (1, 2, 1)
    assert t.driver.unreported == 0
    fresh = t.jobs.make(4)
    assert t.returned(*fresh, now=0.5) == execute(*fresh)


def test_a_write_the_fence_refused_entirely_still_frees_every_slot():
    t, jobs = Trace.with_jobs(2, pool_size=2)
    t.finished(jobs[0], now=0.1)
    write, ride = t.finished(jobs[1], now=0.2)
    assert t.written(set(), now=0.3) == []
    assert (t.driver.stats.applied, t.driver.stats.lost, t.driver.unreported) == (0, 2, 0)


def test_a_failed_write_is_put_back_and_written_once_later():
    t, jobs = Trace.with_jobs(3, pool_size=4, poll_interval=1.0)
    t.finished(jobs[0], now=0.1)
    t.finished(jobs[1], now=0.2)
    write, ride = t.finished(jobs[2], now=0.3)
    assert t.failed(write, now=0.4) == []
    assert t.failed(ride, now=0.4) == []  # the claim behind it never ran
    assert t.driver.unreported == 3 and t.driver.free_slots == 1
    assert t.driver.next_wakeup() == pytest.approx(1.4)
    assert t.tick(1.3) == []
    again = t.tick(1.4)
    # Same outcomes, same order, the claim sized before the write; the ride's failure may have
    # been a lost answer, so the lease is reconciled first (the three held jobs are known).
    assert again == [cmd.ReconcileLease(lease_id=LEASE, known=((1, 1), (2, 1), (3, 1))), write]
    assert t.send(ev.LeaseReconciled(now=1.45, released=frozenset())) == [claim(1)]
    assert t.returned(now=1.5) == []
    assert t.written(write, now=1.6) == [claim(4)]
    assert t.tick(2.6) == []  # nothing buffered: no further write
    writes = [c for _, cs in t.log for c in cs if isinstance(c, cmd.WriteOutcomes)]
    assert writes == [write, write]  # the failed one and its single retry
    assert t.driver.stats.applied == 3 and t.driver.stats.store_faults == 2


def test_a_failed_batch_goes_back_to_the_front_of_the_buffer():
    t, jobs = Trace.with_jobs(4, pool_size=4, max_outcome_batch=2, poll_interval=1.0)
    t.finished(jobs[0], now=0.1)
    write, ride = t.finished(jobs[1], now=0.2)
    t.failed(write, now=0.3)
    t.failed(ride, now=0.3)
    out = t.finished(jobs[2], now=0.4)  # buffer is now 1, 2, 3: full, so it writes 1, 2 again
    assert [ids_of(c) for c in out if isinstance(c, cmd.WriteOutcomes)] == [[1, 2]]
    assert t.written({1, 2}, now=0.5) == []  # 3 alone is not a full batch; job 4 still runs
    out = t.finished(jobs[3], now=0.6)
    assert [ids_of(c) for c in out if isinstance(c, cmd.WriteOutcomes)] == [[3, 4]]


# ---- the linger: a finished job's slot does not wait for a whole batch ---------------------------


def test_an_outcome_is_written_once_it_lingered_though_the_batch_is_not_full():
    t, jobs = Trace.with_jobs(3, pool_size=4, outcome_linger=0.005)
    assert t.finished(jobs[0], now=0.100) == []
    assert t.driver.next_wakeup() == pytest.approx(0.105)
    assert t.finished(jobs[1], now=0.103) == []  # lingers from the oldest: still 0.105
    assert t.driver.next_wakeup() == pytest.approx(0.105)
    out = t.tick_at_wakeup()
    # The claim is sized as if the write landed: 4 - 1 executing.
    assert [type(c) for c in out] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert ids_of(out[0]) == [1, 2] and out[1] == claim(3)
    assert t.driver.next_wakeup() > 0.9  # a write in flight: nothing lingers, the next poll is due


def test_a_zero_linger_writes_each_outcome_as_its_job_finishes_one_write_at_a_time():
    t, jobs = Trace.with_jobs(3, pool_size=4, outcome_linger=0.0)
    first = t.finished(jobs[0], now=0.1)
    assert [type(c) for c in first] == [cmd.WriteOutcomes, cmd.ClaimJobs] and ids_of(first[0]) == [1]
    assert t.finished(jobs[1], now=0.2) == []  # one write in flight at most
    assert t.returned(now=0.25) == []
    # The write lands: the outcome that waited meanwhile has lingered long enough, so it goes next.
    out = t.written(first[0], now=0.3)
    assert [type(c) for c in out] == [cmd.WriteOutcomes, cmd.ClaimJobs] and ids_of(out[0]) == [2]


def test_a_lingered_write_waits_out_the_backoff_of_a_failed_one():
    t, jobs = Trace.with_jobs(3, pool_size=4, outcome_linger=0.005, poll_interval=1.0)
    t.finished(jobs[0], now=0.1)
    write, ride = t.tick_at_wakeup()
    t.failed(write, now=0.2)
    t.failed(ride, now=0.2)
    retry_at = t.driver.next_wakeup()
    assert retry_at > 0.2 + 0.005  # not the linger: the fault's backoff
    assert t.tick(retry_at - 0.001) == []
    assert any(isinstance(c, cmd.WriteOutcomes) for c in t.tick(retry_at))


# ---- learned durations: the linger waits only for a pool about to go idle ---------------------


def _learned_cycle(t: Trace, *, start: float, duration: float, round_trip: float) -> None:
    """One claim of a full pool whose jobs all take ``duration``, written at once when the last
    finishes (the idle pool), the write answered ``round_trip`` later with its claim."""
    jobs = t.jobs.make(t.options.pool_size)
    assert t.returned(*jobs, now=start)[: len(jobs)] == execute(*jobs)
    for job in jobs[:-1]:
        assert t.finished(job, now=start + duration) == []
    write, ride = t.finished(jobs[-1], now=start + duration)
    assert len(write.outcomes) == len(jobs) and ride == claim(len(jobs))
    assert t.written(write, now=start + duration + round_trip) == []


def test_with_jobs_that_run_long_past_a_round_trip_a_finished_job_s_outcome_goes_at_once():
    t = Trace.running(pool_size=4, outcome_linger=0.05)
    _learned_cycle(t, start=0.0, duration=1.0, round_trip=0.01)
    fresh = t.jobs.make(4)
    assert t.returned(*fresh, now=1.01) == execute(*fresh)
    # The other three are expected to run until about 2.01: lingering for an idle pool would
    # keep this slot empty for the whole linger, and the write would carry this outcome alone.
    out = t.finished(fresh[0], now=1.4)
    assert [type(c) for c in out] == [cmd.WriteOutcomes, cmd.ClaimJobs]
    assert ids_of(out[0]) == [fresh[0].id] and out[1] == claim(1)
    # The outcomes that arrive while it is in flight wait for it, then go with the next claim.
    assert t.finished(fresh[1], now=1.405) == []
    assert t.written(out[0], now=1.41) == []
    more = t.jobs.make(1)
    later = t.returned(*more, now=1.41)
    assert later[:1] == execute(*more)
    assert [ids_of(c) for c in later if isinstance(c, cmd.WriteOutcomes)] == [[fresh[1].id]]


def test_with_short_jobs_the_outcomes_wait_for_the_idle_pool_and_a_split_pool_writes_as_one_again():
    t = Trace.running(pool_size=4, outcome_linger=0.05)
    _learned_cycle(t, start=0.0, duration=0.002, round_trip=0.02)
    jobs = t.jobs.make(4)
    t.returned(*jobs, now=0.022)
    for job in jobs[:3]:
        assert t.finished(job, now=0.023) == []  # the fourth is expected to end in a moment
    # It does not: the linger writes the three, and the slow one finishes behind that write.
    split, ride = t.tick_at_wakeup()
    assert ids_of(split) == [j.id for j in jobs[:3]] and ride == claim(3)
    assert t.finished(jobs[3], now=0.074) == []
    assert t.written(split, now=0.093) == []  # due (the pool is idle), but the claim is in flight
    # The claim's three short jobs are expected to end well within a round-trip: the slow
    # one's outcome waits for them, and the pool is written as one batch again.
    short = t.jobs.make(3)
    assert t.returned(*short, now=0.093) == execute(*short)
    assert t.finished(short[0], now=0.094) == []
    assert t.finished(short[1], now=0.094) == []
    write, ride = t.finished(short[2], now=0.095)
    assert ids_of(write) == [jobs[3].id, *(j.id for j in short)] and ride == claim(4)


def test_a_task_not_measured_yet_is_expected_to_end_at_once():
    t = Trace.running(pool_size=2, outcome_linger=0.05)
    _learned_cycle(t, start=0.0, duration=1.0, round_trip=0.01)
    measured, unmeasured = t.jobs.one(), t.jobs.one(task_path="app.tasks.other")
    t.returned(measured, unmeasured, now=1.01)
    # Only the task never seen still runs: it may be as quick as a no-op, so the outcome lingers.
    assert t.finished(measured, now=1.02) == []
    assert t.driver.next_wakeup() == pytest.approx(1.07)


def test_the_expected_finishes_of_jobs_that_ended_do_not_pile_up_under_a_long_one():
    t = Trace.running(pool_size=2, max_claim_batch=1, outcome_linger=0.0)
    (long_job,) = t.jobs.make(1)
    t.returned(long_job, now=0.0)
    now = 0.0
    for _ in range(1_000):
        (short,) = t.jobs.make(1)
        t.returned(short, now=now)
        write, ride = t.finished(short, now=now)
        now += 0.001
        t.written(write, now=now)
    assert len(t.driver._slots.expected_finishes) <= 4 * 2 + 64


def test_durations_are_kept_for_a_bounded_number_of_task_paths():
    from backwave.core.slots import DURATIONS_KEPT

    t = Trace.running(pool_size=1, outcome_linger=0.0)
    now = 0.0
    for n in range(DURATIONS_KEPT + 10):
        job = t.jobs.one(task_path=f"app.tasks.t{n}")
        t.returned(job, now=now)
        write, _ = t.finished(job, now=now + 0.001)
        now += 0.002
        t.written(write, now=now)
    assert len(t.driver._slots.durations) <= DURATIONS_KEPT


# ---- what a finished attempt turns into ----------------------------------------------------------


def _outcome_for(result, *, attempt=1, max_attempts=3, base=2.0, cap=100.0, jitter=0.0) -> Outcome:
    t = Trace.running(pool_size=1)
    job = t.jobs.one(attempt=attempt, max_attempts=max_attempts, backoff_base=base, backoff_max=cap)
    t.returned(job, now=0.1)
    write, ride = t.finished(job, result, jitter=jitter, now=0.2)
    assert ride == claim(1)
    (outcome,) = write.outcomes
    assert outcome.job_id == job.id and outcome.attempt == attempt
    return outcome


def test_succeeded_is_succeeded():
    assert _outcome_for("succeeded", attempt=3, max_attempts=3) == Outcome(job_id=1, attempt=3, kind=OutcomeKind.SUCCEEDED)


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "base", "cap", "jitter", "expected"),
    [
        (1, 3, 2.0, 100.0, 0.5, 1.5),  # ceiling 2: [1, 2)
        (2, 3, 2.0, 100.0, 0.0, 2.0),  # ceiling 4
        (2, 25, 2.0, 100.0, 0.75, 3.5),
        (6, 25, 2.0, 10.0, 0.25, 6.25),  # ceiling 64 capped to 10
    ],
)
def test_failed_with_attempts_left_retries_with_backoff(attempt, max_attempts, base, cap, jitter, expected):
    outcome = _outcome_for("failed", attempt=attempt, max_attempts=max_attempts, base=base, cap=cap, jitter=jitter)
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.retry_delay == expected
    assert outcome.retry_delay == retry_delay(attempt=attempt, base=base, cap=cap, jitter=jitter)


def test_the_event_jitter_is_the_one_used():
    low = _outcome_for("failed", attempt=3, max_attempts=9, jitter=0.0).retry_delay
    high = _outcome_for("failed", attempt=3, max_attempts=9, jitter=0.9).retry_delay
    assert (low, high) == (4.0, 4.0 + 4.0 * 0.9)


@pytest.mark.parametrize(("attempt", "max_attempts"), [(3, 3), (1, 1), (7, 3)])
def test_failed_at_max_attempts_is_failed(attempt, max_attempts):
    outcome = _outcome_for("failed", attempt=attempt, max_attempts=max_attempts, jitter=0.5)
    assert outcome == Outcome(job_id=1, attempt=attempt, kind=OutcomeKind.FAILED, retry_delay=None)


@pytest.mark.parametrize(("attempt", "max_attempts"), [(1, 3), (3, 3), (1, 1)])
def test_unroutable_is_quarantined_and_never_retried(attempt, max_attempts):
    outcome = _outcome_for("unroutable", attempt=attempt, max_attempts=max_attempts, jitter=0.5)
    assert outcome == Outcome(job_id=1, attempt=attempt, kind=OutcomeKind.QUARANTINED, retry_delay=None)


def test_forgiven_attempts_count_neither_towards_the_limit_nor_the_backoff():
    """An attempt that lapsed with its worker and was forgiven (see expire_leases) is not one of
    max_attempts: attempt 3 with one forgiven is the second counted of three, so it retries, with
    the second attempt's backoff; attempt 4 with one forgiven is the third, the last."""
    t = Trace.running(pool_size=2)
    retried = t.jobs.one(attempt=3, forgiven_attempts=1, max_attempts=3, backoff_base=2.0, backoff_max=100.0)
    last = t.jobs.one(attempt=4, forgiven_attempts=1, max_attempts=3)
    t.returned(retried, last, now=0.1)
    t.finished(retried, "failed", jitter=0.0, now=0.2)
    write, _ = t.finished(last, "failed", jitter=0.0, now=0.3)
    assert [(o.job_id, o.attempt, o.kind, o.retry_delay) for o in write.outcomes] == [
        (retried.id, 3, OutcomeKind.RETRY, retry_delay(attempt=2, base=2.0, cap=100.0, jitter=0.0)),
        (last.id, 4, OutcomeKind.FAILED, None),
    ]


def test_mixed_results_in_one_batch_keep_finish_order():
    t = Trace.running(pool_size=3)
    a, b, c = t.jobs.make(3, max_attempts=2)
    t.returned(a, b, c, now=0.1)
    t.finished(c, "unroutable", now=0.2)
    t.finished(a, "failed", jitter=0.5, now=0.3)
    write, ride = t.finished(b, "succeeded", now=0.4)
    assert [(o.job_id, o.kind, o.retry_delay) for o in write.outcomes] == [
        (3, OutcomeKind.QUARANTINED, None),
        (1, OutcomeKind.RETRY, 1.5),
        (2, OutcomeKind.SUCCEEDED, None),
    ]


def test_a_report_rides_on_its_outcome_into_the_write_unlooked_at():
    t, jobs = Trace.with_jobs(2, pool_size=2)
    reports = [object(), object()]
    for job, report in zip(jobs, reports):
        out = t.send(ev.JobFinished(now=t._now(None), job_id=job.id, attempt=1, result="succeeded", report=report))
    (write, _claim) = out
    assert [o.report for o in write.outcomes] == reports  # handed back with the write
    # Equality and repr leave it out: traces and comparisons read as they did.
    assert write.outcomes[0] == Outcome(job_id=jobs[0].id, attempt=1, kind=OutcomeKind.SUCCEEDED)
    assert "report" not in repr(write.outcomes[0])


def test_a_write_that_released_dependents_is_followed_by_a_claim_that_sees_them():
    """The seeds: each applied outcome triggers a re-poll, because a released dependency may be
    due that instant. With the claim riding the write it runs after the write in one
    transaction; a lone write (a tick's flush) is followed by a claim of its own."""
    t, jobs = Trace.with_jobs(1, pool_size=4)
    out = t.finished(jobs[0], now=0.5)
    assert [type(c) for c in out] == [cmd.WriteOutcomes, cmd.ClaimJobs]  # rides: sees the released
    assert t.written(out[0], now=0.6, released=1) == []
    assert t.driver.stats.released == 1
    dependent = t.jobs.make(1)
    assert t.returned(*dependent, now=0.6) == execute(*dependent)

    # A lone write: the tick's poll claimed first (nothing), then flushed; the write re-polls.
    t2, more = Trace.with_jobs(2, pool_size=4, max_outcome_batch=4)
    assert t2.finished(more[0], now=0.5) == []
    tick = t2.tick(now=t2.driver.next_wakeup())
    assert [type(c) for c in tick][:2] == [cmd.ClaimJobs, cmd.WriteOutcomes]
    assert t2.returned(now=t2.now) == []
    assert t2.written(tick[1], now=t2.now, released=3) == [claim(3)]  # pool 4, one executing
    assert t2.driver.stats.released == 3


def test_released_dependents_must_add_up():
    t, jobs = Trace.with_jobs(1, pool_size=4)
    out = t.finished(jobs[0], now=0.5)
    with pytest.raises(InvalidEvent, match="released must be 0 or more"):
        t.written(out[0], now=0.6, released=-1)
    with pytest.raises(InvalidEvent, match="only with applied outcomes"):
        t.written([], now=0.6, released=2)

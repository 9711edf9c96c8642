"""Claims: sizing against free capacity, the poll cadence, hints, and claims the store got wrong."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import InvalidEvent, State

from .helpers import LEASE, Trace, claim, execute, ids_of


def test_claim_is_sized_by_free_capacity_counting_buffered_outcomes():
    t = Trace.running(pool_size=10, max_claim_batch=32, poll_interval=1.0)
    jobs = t.jobs.make(6)
    assert t.returned(*jobs, now=0.1) == execute(*jobs)  # short: 6 of 10
    assert t.finished(jobs[0], now=0.5) == []
    assert t.finished(jobs[1], now=0.6) == []
    assert (t.driver.executing, t.driver.unreported) == (4, 6)
    out = t.tick(1.1)
    # 10 - 4 executing - 2 buffered-unreported = 4, and the claim comes before the write.
    assert [type(c) for c in out] == [cmd.ClaimJobs, cmd.WriteOutcomes]
    assert out[0] == claim(4)
    assert ids_of(out[1]) == [1, 2]


@pytest.mark.parametrize(("pool", "batch", "limits"), [(20, 8, [8, 8, 4]), (16, 32, [16]), (7, 3, [3, 3, 1]), (1, 32, [1])])
def test_full_claims_reclaim_at_once_until_the_pool_is_full(pool, batch, limits):
    t = Trace.running(pool_size=pool, max_claim_batch=batch)
    seen = [t.first_claim_limit]
    while True:
        jobs = t.jobs.make(seen[-1])
        out = t.returned(*jobs, now=0.1)
        assert out[: len(jobs)] == execute(*jobs)
        rest = out[len(jobs) :]
        if not rest:
            break
        assert len(rest) == 1 and isinstance(rest[0], cmd.ClaimJobs)
        seen.append(rest[0].limit)
    assert seen == limits
    assert t.driver.executing == pool
    assert t.driver.free_slots == 0


def test_pool_full_means_no_claim_on_a_tick_or_a_hint():
    t, _ = Trace.with_jobs(4, pool_size=4, poll_interval=1.0)
    for now in (0.1, 1.0, 2.0, 3.5):
        assert t.tick(now) == []
        assert t.hint(now) == []
    assert t.driver.stats.claims == 1


def test_short_claim_polls_again_after_poll_interval():
    t = Trace.running(pool_size=20, poll_interval=2.0)
    jobs = t.jobs.make(3)
    assert t.returned(*jobs, now=0.2) == execute(*jobs)
    assert t.driver.next_wakeup() == pytest.approx(2.2)
    assert t.tick(2.1) == []  # early
    assert t.tick(2.2) == [claim(17)]


def test_empty_claim_polls_again_after_poll_interval():
    t = Trace.running(poll_interval=0.5)
    assert t.returned(now=0.1) == []
    assert t.driver.next_wakeup() == pytest.approx(0.6)
    assert t.tick(0.6) == [claim(20)]
    assert t.returned(now=0.7) == []
    assert t.tick(1.2) == [claim(20)]


def test_a_hint_brings_the_poll_forward():
    t = Trace.running(poll_interval=5.0)
    assert t.returned(now=0.1) == []
    assert t.driver.next_wakeup() == pytest.approx(5.1)
    assert t.hint(0.4) == [claim(20)]
    assert t.returned(now=0.5) == []
    assert t.driver.next_wakeup() == pytest.approx(5.5)  # a short claim re-arms the regular poll


def test_a_hint_while_a_claim_is_in_flight_costs_one_extra_claim():
    t = Trace.running(pool_size=20, poll_interval=5.0)
    assert t.hint(0.05) == []  # the first claim is in flight: remembered, not sent
    a = t.jobs.one()
    assert t.returned(a, now=0.1) == execute(a) + [claim(19)]  # short, yet re-claimed for the hint
    assert t.returned(now=0.2) == []  # the hint was spent: a short claim waits for the poll


def test_a_burst_of_hints_while_a_claim_is_in_flight_costs_one_extra_claim():
    t = Trace.running(pool_size=20, poll_interval=5.0)
    for i in range(50):
        assert t.hint(0.01 * i) == []
    out = t.returned(now=0.6)
    assert out == [claim(20)]
    assert t.returned(now=0.7) == []
    assert t.driver.stats.claims == 2
    assert [type(c) for _, cs in t.log for c in cs].count(cmd.ClaimJobs) == 2


def test_a_hint_with_no_room_does_not_claim_after_the_claim_lands():
    t = Trace.running(pool_size=2, max_claim_batch=2)
    t.hint(0.05)
    jobs = t.jobs.make(2)
    assert t.returned(*jobs, now=0.1) == execute(*jobs)  # full and a hint, but the pool is full


def test_a_hint_with_no_free_slot_does_not_flush_a_half_full_buffer():
    """A hint cannot claim when every slot is taken, finished-but-unreported ones included: it
    must not bring the poll forward either, which would write a half-full batch early."""
    t, jobs = Trace.with_jobs(2, pool_size=2, max_outcome_batch=2, poll_interval=1.0)
    assert t.finished(jobs[0], now=0.2) == []  # buffered: the batch is not full, jobs[1] runs
    assert t.hint(0.3) == []
    write, ride = t.finished(jobs[1], now=0.4)
    assert ids_of(write) == [1, 2] and ride == claim(2)  # one full batch, and the claim riding it


def test_claim_in_flight_holds_its_slots():
    t = Trace.running(pool_size=20, max_claim_batch=8)
    assert t.driver.free_slots == 12
    t.returned(*t.jobs.make(3), now=0.1)  # short
    assert t.driver.free_slots == 17


def test_failed_claim_is_retried_after_poll_interval():
    t = Trace.running(poll_interval=1.0)
    assert t.failed(claim(20), now=0.1) == []
    assert t.driver.free_slots == 20
    assert t.driver.next_wakeup() == pytest.approx(1.1)
    assert t.tick(1.0) == []
    # The failed claim may have committed before its answer was lost: first give back whatever
    # runs under the lease that the driver does not hold (here: nothing it holds), then claim.
    assert t.tick(1.1) == [cmd.ReconcileLease(lease_id=LEASE, known=())]
    assert t.driver.stats.store_faults == 1
    # The claim comes only once the lease is reconciled.
    assert t.send(ev.LeaseReconciled(now=1.2, released=frozenset({(77, 1)}))) == [claim(20)]
    assert t.driver.stats.reconciled == 1
    assert t.returned(now=1.3) == []
    assert t.tick(2.3) == [claim(20)]  # reconciled once: later claims go alone


def test_a_failed_reconcile_is_retried_and_no_claim_goes_before_it():
    t = Trace.running(poll_interval=1.0)
    t.failed(claim(20), now=0.1)
    (reconcile,) = t.tick(1.1)
    assert t.failed(reconcile, now=1.2) == []
    # A hint brings the retry forward, but only of the reconcile: no claim goes before it.
    assert t.hint(1.3) == [reconcile]
    assert t.send(ev.LeaseReconciled(now=1.4, released=frozenset())) == [claim(20)]


def test_a_hint_may_retry_a_failed_claim_early():
    t = Trace.running(poll_interval=10.0)
    t.failed(claim(20), now=0.1)
    assert t.hint(0.2) == [cmd.ReconcileLease(lease_id=LEASE, known=())]
    assert t.send(ev.LeaseReconciled(now=0.3, released=frozenset())) == [claim(20)]


def test_a_short_claim_after_a_write_repolls_when_the_write_lands():
    """Each applied outcome triggers a re-poll: a released dependency may be due that instant."""
    t, jobs = Trace.with_jobs(3, pool_size=4, poll_interval=1.0)
    t.finished(jobs[0], now=0.5)
    out = t.tick(1.0)
    assert out[0] == claim(1) and isinstance(out[1], cmd.WriteOutcomes)
    assert t.returned(now=1.1) == []  # short
    assert t.written({1}, now=1.2) == [claim(2)]  # 4 - 2 executing


# ---- claims the store got wrong ------------------------------------------------------------------


def test_more_jobs_than_asked_is_refused():
    t = Trace.running(pool_size=2)
    with pytest.raises(
        InvalidEvent, match=r"^ClaimReturned cannot be accepted in state RUNNING: the claim asked for 2 jobs and got 3$"
    ):
        t.returned(*t.jobs.make(3), now=0.1)
    assert t.driver.executing == 0
    assert t.driver.free_slots == 0  # the claim is still in flight


def test_duplicate_job_ids_in_one_claim_are_refused():
    t = Trace.running(pool_size=5)
    a = t.jobs.one()
    with pytest.raises(InvalidEvent, match="already holds"):
        t.returned(a, a, now=0.1)
    assert t.driver.executing == 0


def test_a_job_this_pump_already_runs_is_refused():
    t = Trace.running(pool_size=5, poll_interval=1.0)
    a = t.jobs.one()
    t.returned(a, now=0.1)
    assert t.tick(1.1) == [claim(4)]
    with pytest.raises(InvalidEvent, match=r"already holds: \[1\]"):
        t.returned(a, now=1.2)
    assert t.driver.executing == 1


def test_the_claim_behind_a_write_answered_before_the_write_violates_backpressure():
    """The shell promises the write lands first; if it did not, the pool would be over-admitted."""
    t, jobs = Trace.with_jobs(2, pool_size=2)
    t.finished(jobs[0], now=0.2)
    write, ride = t.finished(jobs[1], now=0.3)
    assert ride == claim(2)
    with pytest.raises(InvalidEvent, match=r"backpressure violated: 2 unreported \+ 2 claimed > pool_size 2"):
        t.returned(*t.jobs.make(2), now=0.4)
    assert t.written(write, now=0.4) == []
    more = t.jobs.make(2)
    assert t.returned(*more, now=0.5) == execute(*more)
    assert t.driver.state is State.RUNNING


def test_the_driver_never_asks_for_zero_jobs():
    t, _ = Trace.with_jobs(3, pool_size=3)
    for now in (1.0, 2.0, 3.0):
        t.hint(now)
        t.tick(now + 0.5)
    assert all(c.limit > 0 for _, cs in t.log for c in cs if isinstance(c, cmd.ClaimJobs))
    assert t.driver.stats.claims == 1


def test_an_older_attempts_outcome_never_shares_a_batch_with_the_new_attempt():
    """The write of job 1's retry committed but its answer was lost, so the outcome went back to
    the buffer; the job then comes back in a claim (attempt 2). The old outcome is written alone
    (and refused by the store's fence), never in one batch with attempt 2's."""
    t = Trace.running(pool_size=2, max_outcome_batch=2, poll_interval=1.0)
    (first,) = t.jobs.make(1, max_attempts=3)
    t.returned(first, now=0.1)
    write, ride = t.finished(first, "failed", now=0.2)
    t.failed(write, now=0.3)
    t.failed(ride, now=0.3)
    reconcile, rewrite = t.tick(1.3)
    assert (type(reconcile), ids_of(rewrite)) == (cmd.ReconcileLease, [first.id])
    assert t.send(ev.LeaseReconciled(now=1.35, released=frozenset())) == [claim(1)]
    again = t.jobs.one(id=first.id, attempt=2, max_attempts=3)
    assert t.returned(again, now=1.4) == execute(again)
    assert t.written(set(), now=1.45) == [claim(1)]  # the fence refused attempt 1's outcome; re-poll
    assert t.returned(now=1.46) == []
    write2, _ = t.finished(again, now=1.5)
    assert [(o.job_id, o.attempt) for o in write2.outcomes] == [(first.id, 2)]


def test_a_lost_reply_of_a_write_that_reclaimed_its_job_is_reconciled_by_attempt():
    """With a retry due at once (backoff 0), job 1's retry write committed and the claim riding on
    it took job 1 straight back as attempt 2, under the same lease; both replies were lost. The
    driver still holds attempt 1's outcome, so the reconcile names (job, attempt) pairs: the store
    gives back attempt 2, which the driver never heard of, instead of leaving it running under a
    lease the pump renews for ever. Then the job is claimed and run again."""
    t = Trace.running(pool_size=2, poll_interval=1.0)
    (job,) = t.jobs.make(1, max_attempts=3, backoff_base=0.0)
    t.returned(job, now=0.1)
    write, ride = t.finished(job, "failed", now=0.2)
    assert (write.outcomes[0].attempt, write.outcomes[0].retry_delay, ride) == (1, 0.0, claim(2))
    assert t.failed(write, now=0.3) == []
    assert t.failed(ride, now=0.3) == []

    reconcile, rewrite = t.tick(1.3)
    assert reconcile == cmd.ReconcileLease(lease_id=LEASE, known=((job.id, 1),))
    assert rewrite == write
    # The store gave back the attempt the lost claim had started; then the claim goes.
    assert t.send(ev.LeaseReconciled(now=1.35, released=frozenset({(job.id, 2)}))) == [claim(1)]
    assert t.driver.stats.reconciled == 1
    again = t.jobs.one(id=job.id, attempt=2, max_attempts=3, backoff_base=0.0)
    assert t.returned(again, now=1.4) == execute(again)
    assert t.written(set(), now=1.45) == [claim(1)]  # the fence refused attempt 1's outcome; re-poll
    assert t.returned(now=1.46) == []
    (done, _) = t.finished(again, now=1.5)
    assert [(o.job_id, o.attempt, o.kind.value) for o in done.outcomes] == [(job.id, 2, "succeeded")]


def test_a_reconcile_that_gives_back_an_attempt_the_driver_holds_is_refused():
    t, (job,) = Trace.with_jobs(1, pool_size=2, poll_interval=1.0)
    assert t.tick(1.0) == [claim(1)]
    t.failed(claim(1), now=1.1)
    (reconcile,) = t.tick(2.1)
    assert reconcile.known == ((job.id, 1),)
    with pytest.raises(InvalidEvent, match=r"gave back attempts this pump holds: \[\(1, 1\)\]"):
        t.send(ev.LeaseReconciled(now=2.2, released=frozenset({(job.id, 1)})))
    assert t.driver.executing == 1


def test_jobs_the_pumps_own_maintenance_made_ready_are_claimed_at_once():
    """A pump does not take its own wake-up hints (the shell drops a hint its own store session
    sent), so what its own statements make ready it claims itself: after a write (the claim
    riding it, or the re-poll), and after minting schedules or expiring leases."""
    t = Trace.running(poll_interval=1000.0)
    assert t.returned(now=0.1) == []
    assert t.minted(3, now=0.2) == [claim(20)]
    assert t.returned(now=0.3) == []
    assert t.expired(released=2, now=0.4) == [claim(20)]
    assert t.minted(1, now=0.5) == []  # a claim in flight runs after the mint and sees them
    assert t.returned(now=0.6) == []
    assert t.minted(0, now=0.7) == [] and t.expired(released=0, now=0.8) == []


def test_jobs_made_ready_by_maintenance_wait_when_no_slot_is_free():
    t, _ = Trace.with_jobs(4, pool_size=4, poll_interval=1000.0)
    assert t.minted(3, now=0.2) == [] and t.expired(released=2, now=0.3) == []

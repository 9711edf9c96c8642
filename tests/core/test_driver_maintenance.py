"""Maintenance (expiry, schedules, retention in pages), backoff after store faults, and the
self-fence on writes: driver traces, no clock, no database."""

from __future__ import annotations

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.backoff import fault_delay
from backwave.core.driver import PURGE_BATCH, ROLLUP_BATCH, SELF_FENCE_MARGIN, InvalidEvent, State
from backwave.core.options import Retention, WorkerGroupConfigError

from .helpers import LEASE, MAINTENANCE, Trace, claim, internals, of_type

RETAIN = Retention(
    succeeded=60.0, failed=None, cancelled=120.0, quarantined=None, pumps=600.0, task_stats_minutely=None, task_stats_hourly=None
)
PURGE = cmd.PurgeJobs(retention=RETAIN, limit=PURGE_BATCH)
FULL_MAINTENANCE = [*MAINTENANCE, PURGE, cmd.PurgePumps(older_than=600.0)]


def retaining(**overrides) -> Trace:
    """RUNNING with RETAIN; the start-up maintenance run answered; polls far away."""
    overrides.setdefault("poll_interval", 1000.0)
    overrides.setdefault("lease_duration", 3000.0)
    overrides.setdefault("maintenance_interval", 30.0)
    t = Trace(retention=RETAIN, **overrides)
    t.started()
    assert t.opened() == [claim(t.first_claim_limit), *FULL_MAINTENANCE]
    t.returned(now=0.0)
    t.rolled_up(0, now=0.0)
    return t


# ---- retention -----------------------------------------------------------------------------------


def test_a_maintenance_run_expires_mints_and_purges_in_that_order():
    t = retaining()
    assert t.purged(3, now=0.1) == []  # a short page: done until the next run
    assert t.driver.next_wakeup() == 30.0
    assert t.tick(30.0) == FULL_MAINTENANCE
    assert t.driver.stats.purged == 3


def test_a_full_page_purges_again_on_the_next_tick_not_in_a_loop():
    t = retaining()
    assert t.purged(PURGE_BATCH, now=0.1) == []  # nothing at once: other events go first
    assert t.driver.next_wakeup() == 0.1
    assert t.tick(0.1) == [PURGE]
    assert t.purged(PURGE_BATCH, now=0.2) == []
    assert t.tick(0.2) == [PURGE]
    assert t.purged(7, now=0.3) == []
    assert t.driver.next_wakeup() == 30.0
    assert t.driver.stats.purged == 2 * PURGE_BATCH + 7


def test_a_purge_still_running_is_not_sent_again():
    t = retaining(maintenance_interval=1.0)
    assert t.tick(1.0) == [*MAINTENANCE, cmd.PurgePumps(older_than=600.0)]
    assert t.purged(0, now=1.1) == []
    assert t.rolled_up(0, now=1.1) == []
    assert t.tick(2.0) == FULL_MAINTENANCE


def test_a_failed_purge_waits_for_the_next_run():
    t = retaining()
    assert t.failed(PURGE, now=0.1) == []
    assert t.driver.next_wakeup() == 30.0
    assert t.tick(30.0) == FULL_MAINTENANCE


def test_purging_stops_while_draining():
    t = retaining()
    t.purged(PURGE_BATCH, now=0.1)
    assert t.drain(now=0.1) == [cmd.ReleaseLease(lease_id=LEASE)]
    assert t.tick(0.2) == []


# ---- the statistics rollup ------------------------------------------------------------------------

ROLL_UP = cmd.RollUpStats(limit=ROLLUP_BATCH)


def settled(**overrides) -> Trace:
    """retaining(), with the start-up run's purge answered too: nothing of maintenance in flight."""
    t = retaining(**overrides)
    assert t.purged(0, now=0.0) == []
    return t


def test_the_rollup_goes_before_the_purge_so_the_purge_finds_its_jobs_rolled_up():
    t = settled()
    commands = t.tick(30.0)
    assert commands.index(ROLL_UP) < commands.index(PURGE)


def test_a_full_rollup_page_rolls_up_again_on_the_next_tick_not_in_a_loop():
    t = settled()
    assert t.tick(30.0) == FULL_MAINTENANCE
    assert t.purged(3, now=30.1) == []
    assert t.rolled_up(ROLLUP_BATCH, now=30.1) == []
    assert t.driver.next_wakeup() == 30.1
    assert t.tick(30.1) == [ROLL_UP]  # the rollup alone: the purge page was short
    assert t.rolled_up(ROLLUP_BATCH, now=30.2) == []
    assert t.tick(30.2) == [ROLL_UP]
    assert t.rolled_up(12, now=30.3) == []
    assert t.driver.next_wakeup() == 60.0
    assert t.driver.stats.rolled_up == 2 * ROLLUP_BATCH + 12


def test_full_rollup_and_purge_pages_go_on_together():
    t = settled()
    t.tick(30.0)
    t.rolled_up(ROLLUP_BATCH, now=30.1)
    t.purged(PURGE_BATCH, now=30.1)
    assert t.tick(30.1) == [ROLL_UP, PURGE]


def test_a_rollup_still_running_is_not_sent_again():
    t = settled(maintenance_interval=1.0)
    assert t.tick(1.0) == FULL_MAINTENANCE
    t.purged(0, now=1.1)
    assert t.tick(2.0) == [*MAINTENANCE[:2], cmd.AnalyzeTables(), PURGE, cmd.PurgePumps(older_than=600.0)]


def test_a_failed_rollup_waits_for_the_next_run():
    t = settled()
    t.tick(30.0)
    t.rolled_up(ROLLUP_BATCH, now=30.1)  # a full page: the next is due at once ...
    t.purged(0, now=30.1)
    assert t.tick(30.1) == [ROLL_UP]
    assert t.failed(ROLL_UP, now=30.2) == []  # ... until it fails: then the next run
    assert t.driver.next_wakeup() == 60.0
    assert t.tick(60.0) == FULL_MAINTENANCE


def test_a_rollup_page_out_of_bounds_is_refused():
    t = settled()
    t.tick(30.0)
    with pytest.raises(InvalidEvent, match="0 to 5000"):
        t.rolled_up(ROLLUP_BATCH + 1, now=30.1)


def test_rollup_pages_stop_while_draining():
    t = settled()
    t.tick(30.0)
    t.purged(0, now=30.1)
    t.rolled_up(ROLLUP_BATCH, now=30.1)
    assert t.drain(now=30.1) == [cmd.ReleaseLease(lease_id=LEASE)]
    assert t.tick(30.2) == []


def test_nothing_to_purge_when_everything_is_kept():
    t = Trace.running(lease_duration=3000.0, poll_interval=1000.0)  # the trace default keeps everything
    t.returned(now=0.0)
    assert t.tick(t.options.maintenance_interval) == MAINTENANCE


def test_a_purge_result_nobody_asked_for_is_refused():
    t = Trace.running()
    before = internals(t.driver)
    with pytest.raises(InvalidEvent, match="no PurgeJobs is in flight"):
        t.send(ev.JobsPurged(now=1.0, purged=0))
    assert internals(t.driver) == before


def test_a_purge_page_larger_than_asked_is_refused():
    t = retaining()
    before = internals(t.driver)
    with pytest.raises(InvalidEvent, match="a purge page holds 0 to"):
        t.purged(PURGE_BATCH + 1, now=0.1)
    assert internals(t.driver) == before


def test_minted_jobs_are_counted():
    t = settled()
    assert t.minted(4, now=0.1) == [claim(t.first_claim_limit)]  # and claimed (its own hint is not heard)
    assert t.driver.stats.minted == 4
    with pytest.raises(InvalidEvent, match="minted must not be negative"):
        t.minted(-1, now=0.2)


def test_retention_lists_only_the_states_it_purges_and_refuses_nonsense():
    assert RETAIN.job_states == (("succeeded", 60.0), ("cancelled", 120.0))
    assert Retention().job_states == (
        ("succeeded", 86_400.0),
        ("failed", 604_800.0),
        ("cancelled", 604_800.0),
        ("quarantined", 604_800.0),
    )
    for bad in (-1, float("nan"), "1d", True):
        with pytest.raises(WorkerGroupConfigError, match="Retention succeeded must be a number of seconds >= 0 or None"):
            Retention(succeeded=bad)


# ---- backoff after store faults ------------------------------------------------------------------


def test_fault_delay_doubles_up_to_the_cap_and_jitter_spreads_it():
    assert [fault_delay(streak=n, base=1.0, cap=5.0, jitter=0.5) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert fault_delay(streak=1, base=2.0, cap=5.0, jitter=0.0) == 1.0
    assert fault_delay(streak=1, base=2.0, cap=5.0, jitter=0.999) == pytest.approx(2.998)
    for bad in ({"streak": 0, "jitter": 0.1}, {"streak": 1, "jitter": 1.0}, {"streak": 1, "jitter": -0.1}):
        with pytest.raises(ValueError):
            fault_delay(base=1.0, cap=5.0, **bad)


def test_claims_that_keep_failing_back_off_exponentially_then_reset():
    t = Trace.running(poll_interval=1.0, lease_duration=3000.0, maintenance_interval=5000.0)
    t.failed(claim(20), now=0.0)
    retries = []
    for _ in range(5):
        # A failed claim may have committed: each retry is the ReconcileLease that must land
        # before the next claim (the renewal may be due too; only the store try matters here).
        (reconcile,) = of_type(t.tick_at_wakeup(), cmd.ReconcileLease)
        retries.append(t.now)
        t.failed(reconcile)
    # 1, 2, 4, 8, 16 after each failure: the cap is half a heartbeat (500 s) here.
    assert retries == [1.0, 3.0, 7.0, 15.0, 31.0]
    assert of_type(t.tick_at_wakeup(), cmd.ReconcileLease) == [reconcile]
    assert t.now == 63.0
    assert t.send(ev.LeaseReconciled(now=63.0, released=frozenset())) == [claim(20)]
    assert t.returned() == []  # the store answered: the streak is over
    assert t.driver.next_wakeup() == 64.0
    t.tick(64.0)
    t.failed(claim(20), now=64.0)
    assert t.driver.next_wakeup() == 65.0


def test_a_reconcile_that_lands_ends_the_fault_streak():
    """LeaseReconciled is the store answering: the fault after it backs off from the start."""
    t = Trace.running(poll_interval=1.0, lease_duration=3000.0, maintenance_interval=5000.0)
    t.failed(claim(20), now=0.0)  # streak 1: the reconcile is due at 1
    (reconcile,) = of_type(t.tick_at_wakeup(), cmd.ReconcileLease)
    assert t.now == 1.0
    (claim_after,) = t.send(ev.LeaseReconciled(now=1.0, released=frozenset()))
    assert claim_after == claim(20)
    t.failed(claim_after, now=1.5)
    # A streak of one again: the nominal poll_interval, not twice it.
    assert t.driver.next_wakeup() == 2.5


def test_the_backoff_never_exceeds_half_a_heartbeat():
    t = Trace.running(poll_interval=1.0, lease_duration=12.0, maintenance_interval=5000.0)
    t.failed(claim(20), now=0.0)
    gaps, last = [], 0.0
    while t.now < 30.0 and t.driver.state is State.RUNNING:
        for command in t.tick_at_wakeup():
            if isinstance(command, (cmd.ClaimJobs, cmd.ReconcileLease)):
                gaps.append(t.now - last)
                last = t.now
                t.failed(command)
            elif isinstance(command, cmd.RenewLease):
                t.renewed(True)
    assert max(gaps) == pytest.approx(2.0)  # heartbeat every 4 s: at most 2 s between tries


def test_jitter_spreads_the_retry():
    early, late = Trace(poll_interval=2.0), Trace(poll_interval=2.0)
    for t, jitter in ((early, 0.0), (late, 0.99)):
        assert t.started(now=0.0) == [cmd.OpenLease()]
        t.failed(cmd.OpenLease(), now=0.0, jitter=jitter)
    assert early.driver.next_wakeup() == pytest.approx(1.0)
    assert late.driver.next_wakeup() == pytest.approx(2.98)


def test_a_pipelined_write_and_claim_failing_together_are_one_fault():
    t, jobs = Trace.with_jobs(1, pool_size=4, poll_interval=1.0)
    write, ride = t.finished(jobs[0], now=0.5)
    t.failed(write, now=0.6)
    t.failed(ride, now=0.6)
    assert t.driver.next_wakeup() == pytest.approx(1.6)  # one poll_interval, not two


def test_a_jitter_outside_its_range_is_refused_and_changes_nothing():
    t = Trace.running()
    before = internals(t.driver)
    with pytest.raises(InvalidEvent, match=r"jitter must be in \[0, 1\)"):
        t.failed(claim(20), now=0.1, jitter=1.0)
    assert internals(t.driver) == before


# ---- the self-fence on writes --------------------------------------------------------------------


def test_no_outcome_is_written_once_the_lease_is_no_longer_trusted():
    """A pump that stalled past its lease (SIGSTOP, a long GC pause) and wakes with finished jobs
    must not write their outcomes: another node may already have run them again."""
    t, jobs = Trace.with_jobs(2, pool_size=4, poll_interval=1000.0, lease_duration=30.0)
    trusted_until = 30.0 * (1 - SELF_FENCE_MARGIN)
    assert t.finished(jobs[0], now=trusted_until + 5) == []
    assert t.finished(jobs[1], now=trusted_until + 5) == []  # nothing executes: it would flush
    assert t.driver.next_wakeup() <= t.now  # the fence is due at once
    assert t.tick() == [cmd.OpenLease()]
    assert (t.driver.state, t.driver.unreported) == (State.OPENING, 0)


def test_no_claim_is_sent_once_the_lease_is_no_longer_trusted():
    t = Trace.running(lease_duration=30.0, poll_interval=1000.0, pool_size=8, max_claim_batch=4)
    jobs = t.jobs.make(4)
    out = t.returned(*jobs, now=28.0)  # a full batch with room left would claim again at once
    assert of_type(out, cmd.ClaimJobs) == []
    assert t.tick() == [cmd.OpenLease()]
    assert t.driver.stats.abandoned == 4


def test_a_write_that_landed_just_in_time_still_lets_the_next_one_through():
    t, jobs = Trace.with_jobs(2, pool_size=4, poll_interval=1000.0, lease_duration=30.0)
    assert t.tick(10.0) == [cmd.RenewLease(lease_id=LEASE)]
    t.renewed(True, now=10.0)  # trusted until 37
    t.finished(jobs[0], now=30.0)
    (write, ride) = t.finished(jobs[1], now=30.0)
    assert of_type([write], cmd.WriteOutcomes) and ride == claim(4)


# ---- the statistics' retention ---------------------------------------------------------------------


def test_each_run_purges_statistics_buckets_past_their_resolutions_retention():
    t = Trace(retention=Retention(task_stats_minutely=3600.0, task_stats_hourly=None), maintenance_interval=30.0)
    t.started()
    sent = t.opened()
    stats = [command for command in sent if isinstance(command, cmd.PurgeTaskStats)]
    assert stats == [cmd.PurgeTaskStats(older_than=((60, 3600.0),), limit=cmd.STATS_PURGE_BATCH)]
    assert sent[-1] == stats[0], "last: after the rollup that may still write into those buckets"
    assert t.driver.handle(ev.TaskStatsPurged(now=0.1, purged=5)) == []


def test_statistics_kept_for_ever_send_no_purge():
    t = Trace(retention=Retention(task_stats_minutely=None, task_stats_hourly=None))
    t.started()
    assert not of_type(t.opened(), cmd.PurgeTaskStats)


def test_statistics_retention_defaults_cover_the_admins_longest_ranges():
    from backwave import taskstats  # outside the core; the core names the same widths itself

    retention = Retention()
    assert [width for width, _seconds in retention.task_stats] == list(taskstats.RESOLUTIONS)
    assert retention.task_stats_minutely >= 3600 and retention.task_stats_hourly >= 7 * 86_400
    with pytest.raises(WorkerGroupConfigError, match="task_stats_hourly"):
        Retention(task_stats_hourly=-1.0)

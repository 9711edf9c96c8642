"""roll_up_task_stats: maintenance's rollup of finished attempts into per-task statistics
(every store kind), and why it never moves past an attempt that may still commit (PostgreSQL)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from backwave import taskstats
from backwave.core.jobs import OutcomeKind
from backwave.store.contract import OutcomeRecord

from .test_maintenance import roll_up_everything

A, B = "app.tasks.a", "app.tasks.b"


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


def outcome(job, kind=OutcomeKind.SUCCEEDED, duration=0.0, **fields):
    return OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=kind, duration=duration, **fields)


def run_a_day(store, open_lease, rows) -> None:
    """Seven attempts of two tasks: every outcome, a retry run again, a lapse."""
    lease = open_lease()
    rows.make_jobs(3, task_path=A, max_attempts=2)
    rows.make_jobs(2, task_path=B)
    a1, a2, a3, b1, b2 = claim(store, lease)
    store.write_outcomes_many(
        lease_id=lease.id,
        outcomes=[
            outcome(a1, duration=0.5),
            outcome(a2, duration=2.0),
            outcome(a3, OutcomeKind.RETRY, retry_delay=0, duration=0.1),
            outcome(b1, OutcomeKind.FAILED, duration=1.0, error_class="builtins.KeyError"),
            outcome(b2, OutcomeKind.QUARANTINED, error_class="backwave.Unroutable"),
        ],
    )
    (again,) = claim(store, lease)
    assert (again.id, again.attempt) == (a3.id, 2)
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(again, duration=0.3)])
    doomed = open_lease("host:2:default:0")
    rows.make_jobs(1, task_path=B)
    claim(store, doomed)
    rows.lapse(doomed.id)
    assert store.expire_leases(limit=10) == 1


EXPECTED = {
    A: {
        "succeeded": 3,
        "retried": 1,
        "failed": 0,
        "quarantined": 0,
        "lapsed": 0,
        "cancelled": 0,
        "snoozed": 0,
        "reruns": 1,
        "timed": 4,
        "duration_sum": 2.9,
        "duration_max": 2.0,
        "bins": {taskstats.bin_of(0.5): 1, taskstats.bin_of(2.0): 1, taskstats.bin_of(0.1): 1, taskstats.bin_of(0.3): 1},
    },
    B: {
        "succeeded": 0,
        "retried": 0,
        "failed": 1,
        "quarantined": 1,
        "lapsed": 1,
        "cancelled": 0,
        "snoozed": 0,
        "reruns": 0,
        "timed": 2,
        "duration_sum": 1.0,
        "duration_max": 1.0,
        "bins": {taskstats.bin_of(1.0): 1, taskstats.bin_of(0.0): 1},
    },
}


def test_every_attempt_is_counted_once_by_task_and_outcome_at_both_resolutions(store, open_lease, rows):
    run_a_day(store, open_lease, rows)
    assert roll_up_everything(store) == 7
    for resolution in taskstats.RESOLUTIONS:
        assert rows.task_stats(resolution) == EXPECTED
    assert roll_up_everything(store) == 0, "nothing is rolled up twice"
    assert rows.task_stats(60) == EXPECTED


def test_a_later_page_adds_into_the_buckets_it_shares(store, open_lease, rows):
    run_a_day(store, open_lease, rows)
    roll_up_everything(store)
    lease = open_lease("host:3:default:0")
    (fresh,) = rows.make_jobs(1, task_path=A)
    (late,) = [job for job in claim(store, lease) if job.id == fresh.pk]  # the lapsed one runs again beside it
    store.write_outcomes_many(lease_id=lease.id, outcomes=[outcome(late, duration=0.5)])
    assert roll_up_everything(store) == 1
    a = rows.task_stats(3600)[A]
    assert (a["succeeded"], a["timed"], a["duration_sum"]) == (4, 5, 3.4)
    assert a["bins"][taskstats.bin_of(0.5)] == 2  # the histograms merged, bin by bin


def test_pages_of_any_size_add_up_to_the_same(store, open_lease, rows):
    run_a_day(store, open_lease, rows)
    pages = [store.roll_up_task_stats(limit=2, settle=0) for _ in range(8)]
    assert sum(pages) == 7 and max(pages) == 2
    assert rows.task_stats(60) == EXPECTED


def test_nothing_is_rolled_up_before_the_horizon_an_earlier_run_took(store, open_lease, rows):
    store.roll_up_task_stats(limit=10, settle=0)  # the row (again, after a flush) and a first horizon
    store.roll_up_task_stats(limit=10, settle=0)
    run_a_day(store, open_lease, rows)
    assert store.roll_up_task_stats(limit=10, settle=0) == 0  # takes the horizon past the seven
    assert store.roll_up_task_stats(limit=10, settle=0) == 7


def test_a_limit_below_one_does_nothing(store, open_lease, rows):
    run_a_day(store, open_lease, rows)
    assert store.roll_up_task_stats(limit=0, settle=0) == 0
    assert rows.stat_buckets() == []


@pytest.mark.stores("postgres")
def test_an_attempt_committed_after_a_later_one_is_waited_for_not_skipped(store, open_lease, rows):
    """Attempt N is inserted by a transaction still open while N+1 commits: the rollup must not
    move its watermark past N until that transaction ends (pg_current_snapshot's xip list)."""
    run_a_day(store, open_lease, rows)
    roll_up_everything(store)
    job = rows.make_jobs(1, task_path=A, state="succeeded")[0]
    late = psycopg.connect(**connection.get_connection_params())
    try:
        late.execute(
            "INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at, error_class, traceback)"
            " VALUES (%s, 1, 'succeeded', 'w', now() - interval '1 second', now(), '', '')",
            [job.pk],
        )
        rows.add_attempt(job_id=job.pk, number=2, state="succeeded", worker_id="w")  # committed, a higher id
        # Caught up and settled by time (whatever other sessions on the server keep open): this
        # run takes the horizon, both ids below it, the open transaction older than its xmax.
        assert store.roll_up_task_stats(limit=10, settle=0) == 0
        assert store.roll_up_task_stats(limit=10) == 0, "the open transaction holds the watermark back"
        late.commit()
        assert sum(store.roll_up_task_stats(limit=10, settle=0) for _ in range(2)) == 2
    finally:
        late.close()
    assert rows.task_stats(60)[A]["succeeded"] == 3 + 2


@pytest.mark.stores("postgres")
def test_a_node_that_finds_another_rolling_up_does_nothing_and_does_not_wait(store, open_lease, rows):
    run_a_day(store, open_lease, rows)
    store.roll_up_task_stats(limit=10, settle=0)  # the row, after the flush
    store.roll_up_task_stats(limit=10, settle=0)  # its horizon
    other = psycopg.connect(**connection.get_connection_params())
    try:
        other.execute("SELECT watermark FROM backwave_stats_rollup WHERE id = 1 FOR UPDATE")  # another node, mid-rollup
        other.execute("SET lock_timeout = '2s'")
        assert store.roll_up_task_stats(limit=10, settle=0) == 0
        other.rollback()
        assert store.roll_up_task_stats(limit=10, settle=0) == 7
    finally:
        other.close()
    assert rows.task_stats(60) == EXPECTED


# ---- retention of the statistics ----------------------------------------------------------------


def test_buckets_older_than_their_resolutions_retention_are_purged(store, open_lease, rows):
    """Statistics grow a row per task a minute: maintenance drops the buckets past retention,
    each resolution by its own age, and keeps the rest."""
    run_a_day(store, open_lease, rows)
    roll_up_everything(store)
    kept = rows.stat_buckets()
    assert {resolution for resolution, _bucket, _task in kept} == {60, 3600}
    rows.age_stat_buckets(resolution=60, seconds=3 * 86_400)
    rows.age_stat_buckets(resolution=3600, seconds=3 * 86_400)
    minutes = sum(1 for resolution, _bucket, _task in kept if resolution == 60)  # two, or more across a minute
    hours = len(kept) - minutes
    assert store.purge_task_stats(older_than=((60, 2 * 86_400.0), (3600, 30 * 86_400.0)), limit=100) == minutes
    assert {(resolution, task) for resolution, _bucket, task in rows.stat_buckets()} == {(3600, A), (3600, B)}
    assert store.purge_task_stats(older_than=((3600, 86_400.0),), limit=1) == 1, "at most limit rows a call"
    assert store.purge_task_stats(older_than=((3600, 86_400.0),), limit=100) == hours - 1
    assert rows.stat_buckets() == []
    assert store.purge_task_stats(older_than=(), limit=100) == 0

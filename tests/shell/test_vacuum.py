"""The job table's cleanup: a worker vacuums the job table once enough has changed, so claims do
not walk the dead index entries earlier claims left at the front of the claim index.

Against the real PostgreSQL (autovacuum is off on the test server, as it may be on a user's CI):
the claim-order scan's buffers are counted before and after, never timed.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection
from django.test import override_settings

from backwave import conf
from backwave.management.commands.backwave_worker import _job_table_cleaners
from backwave.models import Job
from backwave.shell.vacuum import Baseline, JobTableCleaner, vacuum_due
from backwave.store.postgres import django_conninfo
from backwave.store.vacuum import JobTableVacuum, TableChanges
from tests.factories import JobFactory
from tests.shell.conftest import wait_until

QUEUE = "vacuumed"


# -- when a vacuum is due ------------------------------------------------------------------------


def test_a_vacuum_is_due_once_the_changes_since_the_last_reach_the_threshold():
    baseline = Baseline(changed=1_000, vacuums=3)
    assert not vacuum_due(TableChanges(changed=20_999, rows=10_000, vacuums=3), baseline, after=20_000)
    assert vacuum_due(TableChanges(changed=21_000, rows=10_000, vacuums=3), baseline, after=20_000)


def test_on_a_large_table_the_threshold_is_a_share_of_its_rows():
    """A vacuum costs in proportion to the table: 2% of 10,000,000 rows, not 20,000 changes."""
    baseline = Baseline(changed=0, vacuums=0)
    assert not vacuum_due(TableChanges(changed=199_999, rows=10_000_000, vacuums=0), baseline, after=20_000)
    assert vacuum_due(TableChanges(changed=200_000, rows=10_000_000, vacuums=0), baseline, after=20_000)


def test_nothing_is_owed_after_someone_else_s_vacuum_or_a_reset_of_the_counters():
    baseline = Baseline(changed=1_000, vacuums=3)
    assert not vacuum_due(TableChanges(changed=90_000, rows=0, vacuums=4), baseline, after=20_000)
    assert not vacuum_due(TableChanges(changed=10, rows=0, vacuums=3), baseline, after=20_000)


def test_a_threshold_below_one_row_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        JobTableCleaner(JobTableVacuum({}), after=0)


# -- against the real server ---------------------------------------------------------------------


def _flush_statistics() -> None:
    """Hand the counters this session owes to the statistics system now, not within a second."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _claim_and_finish(count: int) -> None:
    """What claims and their outcomes do to the claim index: rows leave it, in claim order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE backwave_job SET state = 'succeeded', finished_at = now(), attempts = 1 WHERE id IN ("
            " SELECT id FROM backwave_job WHERE state = 'ready' AND queue = %s ORDER BY priority DESC, run_at, id LIMIT %s)",
            [QUEUE, count],
        )
    _flush_statistics()


def _claim_scan_buffers() -> int:
    """Buffers the claim's ordered scan of the claim index touches to find the next ready job."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_bitmapscan = off")
        cursor.execute("SET enable_sort = off")
        try:
            query = "SELECT id FROM backwave_job WHERE state = 'ready' AND queue = %s ORDER BY priority DESC, run_at, id LIMIT 1"
            cursor.execute(query, [QUEUE])  # the first scan marks the dead entries it meets as dead
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, [QUEUE])
            (plan,) = cursor.fetchone()
            plan = json.loads(plan) if isinstance(plan, str) else plan
        finally:
            cursor.execute("RESET enable_seqscan")
            cursor.execute("RESET enable_bitmapscan")
            cursor.execute("RESET enable_sort")
    scan = plan[0]["Plan"]
    while scan.get("Plans"):
        scan = scan["Plans"][0]
    assert scan.get("Index Name") == "backwave_job_claim", scan
    return scan["Shared Hit Blocks"] + scan["Shared Read Blocks"]


@pytest.fixture
def cleaners():
    made: list[JobTableCleaner] = []

    def make(after: int) -> JobTableCleaner:
        made.append(JobTableCleaner(JobTableVacuum(django_conninfo(connection.settings_dict)), after=after, check_every=0.05))
        return made[-1]

    yield make
    for cleaner in made:
        cleaner.stop()


@pytest.mark.django_db(transaction=True)
def test_once_enough_changed_the_cleaner_vacuums_and_the_claim_walks_no_dead_entries(cleaners):
    Job.objects.bulk_create(JobFactory.build_batch(12_000, queue=QUEUE))
    _flush_statistics()
    cleaner, other_worker = cleaners(after=5_000), cleaners(after=5_000)
    assert not cleaner.step() and not other_worker.step()  # the first reading is the baseline

    _claim_and_finish(4_000)
    assert not cleaner.step()  # 4,000 changed rows: not due
    _claim_and_finish(6_000)
    walked_before = _claim_scan_buffers()
    assert walked_before >= 20  # 10,000 dead entries at the index's front

    assert cleaner.step()
    assert cleaner.vacuums == 1
    assert _claim_scan_buffers() <= 3  # the root, a leaf, and the heap page of the next job
    # The other worker saw the vacuum: nothing is owed to it, and nothing to the cleaner.
    assert not other_worker.step() and other_worker.vacuums == 0
    assert not cleaner.step()


@pytest.mark.django_db(transaction=True)
def test_the_cleaner_s_thread_vacuums_as_changes_come_in_and_stops_with_the_worker(cleaners):
    Job.objects.bulk_create(JobFactory.build_batch(3_000, queue=QUEUE))
    _flush_statistics()
    cleaner = cleaners(after=1_000)
    cleaner.start()
    wait_until(lambda: cleaner._baseline is not None, "the cleaner's first reading")
    _claim_and_finish(2_000)
    wait_until(lambda: cleaner.vacuums == 1, "a vacuum by the cleaner's thread")
    assert _claim_scan_buffers() <= 3
    cleaner.stop()
    assert not cleaner.alive


@pytest.mark.django_db(transaction=True)
def test_a_lost_session_is_opened_again_and_the_thread_goes_on(cleaners, caplog):
    cleaner = cleaners(after=1_000)
    cleaner._session.changes()  # connected
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'backwave-vacuum' AND datname = current_database()"
        )
    Job.objects.bulk_create(JobFactory.build_batch(1_500, queue=QUEUE))
    _flush_statistics()
    caplog.set_level(logging.WARNING, logger="backwave.maintenance")
    cleaner.start()
    wait_until(lambda: cleaner._baseline is not None, "a reading on a new session", timeout=10)
    assert "Job table cleanup" in caplog.text
    _claim_and_finish(1_500)
    wait_until(lambda: cleaner.vacuums == 1, "a vacuum after the reconnect")
    assert cleaner.alive


def test_a_worker_runs_one_cleaner_per_database_unless_the_setting_says_none():
    with override_settings(BACKWAVE={"VACUUM_JOB_TABLE_AFTER": 7_000}):
        (cleaner,) = _job_table_cleaners(["default"]).values()
        assert cleaner._after == 7_000
    with override_settings(BACKWAVE={"VACUUM_JOB_TABLE_AFTER": None}):
        assert _job_table_cleaners(["default"]) == {}


@pytest.mark.parametrize("value", [0, -5, 2.5, "many", True])
def test_a_bad_threshold_is_named_in_the_setting_s_error(value):
    assert conf.VALIDATORS["VACUUM_JOB_TABLE_AFTER"](value) == "an integer >= 1, or None (autovacuum alone)"

"""Retention on PostgreSQL: finished jobs past their state's age go, in bounded pages, with
their attempts; nothing unfinished or recent is ever touched."""

from __future__ import annotations

import pytest

from backwave.core.options import Retention
from backwave.models import Attempt, Job

from .conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

RETENTION = Retention(succeeded=3600.0, failed=86_400.0, cancelled=86_400.0, quarantined=None)


def job(state: str, *, finished_hours_ago: float | None, attempts: int = 0) -> int:
    """A job in ``state`` that finished that many hours ago by the database clock."""
    created = Job.objects.create(
        task_path="app.tasks.t", payload={"args": [], "kwargs": {}}, state=state, attempts=attempts, max_attempts=3
    )
    if finished_hours_ago is not None:
        sql(
            "UPDATE backwave_job SET finished_at = now() - make_interval(secs => %s) WHERE id = %s",
            [finished_hours_ago * 3600, created.id],
        )
    for number in range(1, attempts + 1):
        Attempt.objects.create(job=created, number=number, state="failed", worker_id="w")
    return created.id


def test_only_finished_jobs_past_their_states_retention_are_purged(store):
    old = [
        job("succeeded", finished_hours_ago=2, attempts=2),
        job("failed", finished_hours_ago=25, attempts=3),
        job("cancelled", finished_hours_ago=48),
    ]
    kept = [
        job("succeeded", finished_hours_ago=0.5),  # too recent
        job("failed", finished_hours_ago=23),  # failures are kept longer
        job("quarantined", finished_hours_ago=10_000),  # kept for ever (None)
        job("ready", finished_hours_ago=None),
    ]
    # A running job under a lease: never purged, whatever its timestamps say.
    sql(
        "INSERT INTO backwave_lease (id, worker_id, \"group\", hostname, pid, expires_at) VALUES (gen_random_uuid(), 'w', 'g', 'h', 1, now())"
    )
    running = Job.objects.create(task_path="t", payload={}, state="running", lease_id=sql("SELECT id FROM backwave_lease")[0][0])
    sql("UPDATE backwave_job SET finished_at = now() - interval '100 days' WHERE id = %s", [running.id])

    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1000) == 3
    assert set(Job.objects.values_list("id", flat=True)) == {*kept, running.id}
    assert not Attempt.objects.filter(job_id__in=old).exists(), "attempts go with their job"
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1000) == 0


def test_a_purge_is_paged_and_the_pages_end_short(store):
    for _ in range(7):
        job("succeeded", finished_hours_ago=5, attempts=1)
    pages = []
    while True:
        pages.append(store.purge_jobs(older_than=RETENTION.job_states, limit=3))
        if pages[-1] < 3:
            break
    assert pages == [3, 3, 1]
    assert Job.objects.count() == 0 and Attempt.objects.count() == 0


def test_oldest_first_within_a_state(store):
    newer = job("succeeded", finished_hours_ago=2)
    older = job("succeeded", finished_hours_ago=9)
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1) == 1
    assert list(Job.objects.values_list("id", flat=True)) == [newer]
    assert older not in Job.objects.values_list("id", flat=True)


def test_nothing_listed_nothing_purged(store):
    job("succeeded", finished_hours_ago=1000)
    assert store.purge_jobs(older_than=(), limit=100) == 0
    assert store.purge_jobs(older_than=Retention(succeeded=None).job_states[:0], limit=100) == 0
    assert Job.objects.count() == 1


def test_the_purge_walks_the_finished_index_not_the_table(store):
    """With the planner told to avoid sequential scans only where it has a choice, the purge's
    plan reaches rows through backwave_job_finished: the partial index its WHERE repeats."""
    from django.db import connection

    from backwave.store.queries import QUERIES

    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(
                "EXPLAIN " + QUERIES["purge_jobs"], {"older_than": '[{"state": "succeeded", "seconds": 60}]', "limit": 10}
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "backwave_job_finished" in plan, plan

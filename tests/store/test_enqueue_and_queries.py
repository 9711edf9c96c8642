"""enqueue_many (every store kind), and the SQL file loader."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backwave.store.contract import NewJob
from backwave.store.queries import QUERIES, parse_queries


@pytest.mark.stores("postgres")  # the parameter limit and one round-trip are PostgreSQL's
def test_twenty_thousand_jobs_in_one_round_trip_in_order(store, rows):
    jobs = [NewJob(task_path="app.tasks.n", payload={"args": [n], "kwargs": {}}, priority=n % 5) for n in range(20_000)]
    before = store.round_trips

    ids = store.enqueue_many(jobs)

    assert store.round_trips == before + 1
    assert len(ids) == 20_000 and ids == sorted(ids)
    jobs = rows.jobs()
    stored = [(pk, jobs[pk].payload, jobs[pk].priority) for pk in ids]
    assert stored == [(pk, {"args": [n], "kwargs": {}}, n % 5) for n, pk in enumerate(ids)]


def test_enqueued_fields_and_the_database_clock(store, rows):
    later = timezone.now() + timedelta(hours=2)
    before = rows.now()
    now_id, later_id = store.enqueue_many(
        [
            NewJob(
                task_path="a.b",
                payload={"args": [], "kwargs": {}},
                queue="emails",
                max_attempts=3,
                tags=("x", "y"),
                backend="other",
            ),
            NewJob(task_path="a.c", payload={"args": [], "kwargs": {}}, run_at=later, backoff_base=2.5, backoff_max=10),
        ]
    )
    after = rows.now()
    due, scheduled = rows.job(now_id), rows.job(later_id)
    assert (due.state, due.queue, due.attempts, due.max_attempts, due.tags, due.backend) == (
        "ready",
        "emails",
        0,
        3,
        ["x", "y"],
        "other",
    )
    assert before <= due.run_at <= after
    assert scheduled.run_at == later
    assert (scheduled.backoff_base, scheduled.backoff_max) == (2.5, 10.0)


def test_enqueueing_nothing_costs_no_round_trip(store):
    before = store.round_trips
    assert store.enqueue_many([]) == []
    assert store.round_trips == before


def test_every_statement_the_store_uses_is_loaded():
    assert set(QUERIES) == {
        "open_lease",
        "renew_lease",
        "release_lease",
        "claim_jobs_one_queue",
        "claim_jobs_many_queues",
        "claimed_jobs",
        "claimed_rows",  # the claims' shared CTE and final SELECT, included by each
        "write_outcomes_many",
        "release_jobs_many",
        "expire_leases",
        # the plain outcome write (no job of its batch has dependents) and the blocks both share
        "write_outcomes_plain",
        "outcome_taken",
        "outcome_applied",
        "outcome_noted",
        "outcome_attempts",
        "sync_schedules",
        "due_schedules",
        "mint_schedules_many",
        "purge_jobs",
        "roll_up_task_stats",
        "record_pumps_many",
        "forget_pumps_many",
        "purge_pumps",
        "purge_task_stats",
        "lock_limited_queues",
        "reconcile_lease",
        "set_transaction_settings",
        "enqueue_many",
        "has_due_jobs",
        "heartbeat",
        # workflows: the dependent enqueue (its head CTEs, which the operator's purge shares, and
        # the caller's setting it puts back), the outcome write's lock, the shared settling CTEs
        "enqueue_with_dependencies",
        "key_lookups_by_index",
        "restore_enable_seqscan",
        "lock_outcome_jobs",
        "settle_dependents",
        "claim_transitions",
        "settle_transitions",  # the observer loop's
        # admission: unique enqueues, the claim of queues under a per-key or rate limit
        "enqueue_unique_many",
        "claim_jobs_admitted",
        "lock_admitted_queues",
        # handlers that outlived their attempt: the outcome writes' overrun rows, and their end
        "outcome_overran",
        "forget_overruns",
        # the operator's statements (backwave/store/operator.py), on Django's connection
        "act_on_jobs",
        "retry_job_assignments",
        "cancel_job_assignments",
        "cancel_jobs",
        "set_schedules_enabled",
        "upsert_queues",
        "retry_job_dependents",
        "cancel_job_dependents",
        "ancestor_outputs",
        "admin_job_links",
        "admin_table_statistics",
        "admin_queue_overview",
        "admin_throughput",
        "admin_pumps_in_flight",
        "available_connections",
        # the dashboard's and the Task statistics page's reads
        "admin_rollup_status",
        "admin_stats_series",
        "admin_task_stats",
        "admin_recent_failures",
        "admin_running_jobs",
        "admin_queue_latency",
        "admin_hint_sessions",
        "unserved_queues",
        "purge_selected_jobs",
        "admin_jobs_page_details",
        "metrics_queues",
        "metrics_lapsed_leases",
        "metrics_without_jit",
        "set_queue_admission",
        "queue_has_admission",
        "job_table_changes",
        "vacuum_backwave_job",  # the job table's cleanup (backwave/store/vacuum.py)
        # maintenance: the planner's statistics of the tables autovacuum left behind
        "stale_statistics",
        "analyze_backwave_job",
        "analyze_backwave_attempt",
        "analyze_backwave_dependency",
        "analyze_backwave_transition",
    }
    assert all("--" not in sql.splitlines()[0] for sql in QUERIES.values())


def test_the_loader_splits_named_blocks_and_drops_comment_lines():
    text = "-- preamble\n-- name: one\n-- why 100%\nSELECT 1\n\n-- name: two\nSELECT %(x)s\n  -- indented note\nFROM t\n"
    assert parse_queries(text) == {"one": "SELECT 1", "two": "SELECT %(x)s\nFROM t"}


@pytest.mark.parametrize(
    ("text", "message"),
    [("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "defined twice"), ("-- name: a\n-- only a comment\n", "has no SQL")],
)
def test_the_loader_rejects_a_broken_file(text, message):
    with pytest.raises(ValueError, match=message):
        parse_queries(text)

"""The claim's plan: served by the partial index backwave_job_claim, never a scan-and-sort.

A regression guard for the SQL shapes in queries.sql: with finished rows piling up and a backlog
of ready ones, each queue is read through an ordered index scan, so a claim costs about
``limit`` index tuples per queue however large the table grows. The claim's suspect (at most one)
and the check that its lease runs none yet are probes of their own small partial indexes.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection

from backwave.store.queries import QUERIES

pytestmark = pytest.mark.django_db(transaction=True)


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


@pytest.fixture
def backlog(transactional_db):
    """20,000 finished and 5,000 ready jobs over three queues, 300 of them running under 15 leases
    (the other pumps of a cluster), with fresh statistics."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO backwave_job (task_path, queue, priority, payload, state, backend, tags, run_at,
                                      enqueued_at, attempts, max_attempts, backoff_base, backoff_max, worker_id)
            SELECT 't.t', (ARRAY['default', 'emails', 'reports'])[1 + g % 3], g % 7 - 3, '{}',
                   CASE WHEN g <= 20000 THEN 'succeeded' ELSE 'ready' END, 'default', '{}',
                   now() - make_interval(secs => g), now(), 0, 1, 1, 3600, ''
            FROM generate_series(1, 25000) AS g
        """)
        for _ in range(15):
            lease_id = uuid.uuid4()
            cursor.execute(
                "INSERT INTO backwave_lease (id, worker_id, \"group\", hostname, pid, created_at, renewed_at, expires_at)"
                " VALUES (%s, 'w', 'g', 'h', 1, now(), now(), now() + interval '1 hour')",
                [lease_id],
            )
            cursor.execute(
                "UPDATE backwave_job SET state = 'running', lease_id = %s, attempts = 1"
                " WHERE id IN (SELECT id FROM backwave_job WHERE state = 'ready' ORDER BY id DESC LIMIT 20)",
                [lease_id],
            )
        cursor.execute("ANALYZE backwave_job")


def _counts_running(node: dict) -> bool:
    """The heap side of a bitmap scan of backwave_job_running_queue (a limited queue's count)."""
    children = node.get("Plans", ())
    return node["Node Type"] == "Bitmap Heap Scan" and bool(children) and all(c.get("Index Name") == "backwave_job_running_queue" for c in children)


def explain(name: str, params: dict) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {QUERIES[name]}", params)
        (document,) = cursor.fetchone()
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return list(plan_nodes(plan))


@pytest.mark.parametrize(("name", "queue_params"), [
    ("claim_jobs_one_queue", {"queue": "default"}),
    ("claim_jobs_many_queues", {"queues": ["default", "emails", "reports"]}),
])
def test_the_claim_reads_the_partial_index_in_order(backlog, name, queue_params):
    nodes = explain(name, {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, **queue_params})

    # Every read of backwave_job besides the UPDATE's primary-key lookups of the picked ids and
    # the count of a limited queue's running jobs (its own partial index, checked below): the
    # ordered scan, the suspect's probe, and the probe of this lease's running suspects.
    job_scans = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]
                 and n.get("Index Name") not in ("backwave_job_pkey", "backwave_job_running_queue") and not _counts_running(n)]
    assert sorted(str(n.get("Index Name")) for n in job_scans) == [
        "backwave_job_claim", "backwave_job_claim_suspect", "backwave_job_running_suspect",
    ], [(n["Node Type"], n.get("Index Name")) for n in job_scans]
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in job_scans), job_scans
    (lease_check,) = [n for n in job_scans if n["Index Name"] == "backwave_job_running_suspect"]
    assert "lease_id" in lease_check["Index Cond"]
    running_counts = [n for n in nodes if n.get("Index Name") == "backwave_job_running_queue"]
    assert running_counts and all("Only Scan" in n["Node Type"] or "Index Scan" in n["Node Type"] for n in running_counts)
    # The rows come out of the index already in claim order: no Sort sits under a LockRows.
    for lock in (n for n in nodes if n["Node Type"] == "LockRows"):
        assert all(n["Node Type"] != "Sort" for n in plan_nodes(lock)), lock


@pytest.fixture
def keyed_backlog(backlog):
    """The backlog, each job under one of 100 limit keys, the running ones too; "default" under
    a per-key concurrency limit, a rate limit and a per-key rate limit."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE backwave_job SET limit_key = 'customer-' || (id % 100) WHERE state IN ('ready', 'running')")
        cursor.execute(
            "INSERT INTO backwave_queue (name, paused, updated_at, key_concurrency_limit, rate_limit, key_rate_limit, rate_period, rate_window_used)"
            " VALUES ('default', false, now(), 2, 1000, 10, 1, 0)"
        )
        # Key windows of many queues (the table holds every queue's active keys).
        cursor.execute(
            "INSERT INTO backwave_key_rate_window (queue, limit_key, window_start, used)"
            " SELECT 'q' || (g % 50), 'customer-' || g, date_trunc('second', now()), 1 FROM generate_series(1, 20000) AS g"
        )
        cursor.execute("ANALYZE backwave_job")
        cursor.execute("ANALYZE backwave_key_rate_window")


@pytest.mark.parametrize("queues", [["default"], ["default", "emails", "reports"]])
def test_the_admitted_claim_reads_indexes_only(keyed_backlog, queues):
    nodes = explain("claim_jobs_admitted", {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, "queues": queues})
    job_scans = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]]
    # Running rows (a limited queue's count, the keys at their limit) may be read through a bitmap
    # of their small partial indexes; everything else is a plain index scan.
    bitmaps = [n for n in job_scans if n["Node Type"] == "Bitmap Heap Scan"]
    assert all(c.get("Index Name") in ("backwave_job_running_queue", "backwave_job_running_key") for b in bitmaps for c in b["Plans"]), bitmaps
    job_scans = [n for n in job_scans if n not in bitmaps] + [c for b in bitmaps for c in b["Plans"]]
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") for n in job_scans), [(n["Node Type"], n.get("Index Name")) for n in job_scans]
    used = {n.get("Index Name") for n in job_scans}
    # The ordered claim scan, and the per-key counts from the partial index of running keyed jobs.
    assert {"backwave_job_claim", "backwave_job_running_key"} <= used, used
    assert used <= {
        "backwave_job_claim", "backwave_job_claim_suspect", "backwave_job_running_suspect", "backwave_job_running_key",
        "backwave_job_running_queue", "backwave_job_pkey",
    }, used
    for lock in (n for n in nodes if n["Node Type"] == "LockRows"):
        assert all(n["Node Type"] != "Sort" for n in plan_nodes(lock)), lock
    # The per-key rate windows are read by key or by this window, never scanned whole.
    windows = [n for n in nodes if n.get("Relation Name") == "backwave_key_rate_window" and "Scan" in n["Node Type"]]
    assert windows and all(n["Node Type"] != "Seq Scan" for n in windows), [(n["Node Type"], n.get("Index Name")) for n in windows]


def test_a_unique_enqueue_is_arbitrated_by_the_partial_unique_index(transactional_db):
    jobs = json.dumps([{"task_path": "t.t", "payload": {"args": [], "kwargs": {}}, "queue": "default", "priority": 0,
                        "max_attempts": 1, "backoff_base": 1, "backoff_max": 1, "backend": "default", "tags": [],
                        "unique_key": "k", "unique_states": ["ready"], "unique_replace": []}])
    nodes = explain("enqueue_unique_many", {"jobs": jobs, "hint": False})
    (insert,) = [n for n in nodes if n.get("Operation") == "Insert"]
    assert insert["Conflict Resolution"] == "UPDATE"
    assert insert["Conflict Arbiter Indexes"] == ["backwave_job_unique_key"]

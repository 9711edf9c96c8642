"""The jobs search's plans: an argument value is found through the GIN index on payload
(jsonb_path_ops), a tag through the GIN index on tags, never by reading the table. (The same
plans at 1,000,000 rows are in the branch's report.)"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from backwave.ops import search as job_search
from backwave.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs_with_arguments(db):
    """20,000 finished jobs with keyword arguments and tags, with fresh statistics."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO backwave_job (task_path, queue, priority, payload, state, backend, tags, run_at, enqueued_at,
                                      finished_at, attempts, max_attempts, backoff_base, backoff_max, worker_id)
            SELECT 'shop.tasks.send', 'default', 0,
                   jsonb_build_object('args', jsonb_build_array(g % 2000), 'kwargs', jsonb_build_object('customer_id', g % 5000, 'order_id', g)),
                   CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END, 'default', ARRAY['tenant:' || (g % 200)],
                   now(), now(), now(), 1, 1, 1, 3600, ''
            FROM generate_series(1, 20000) AS g
        """)
        # Rows inserted go to the GIN indexes' pending lists (fastupdate), which a scan reads
        # whole and the planner prices as such; autovacuum merges them in a live database.
        cursor.execute("SELECT gin_clean_pending_list('backwave_job_payload'), gin_clean_pending_list('backwave_job_tags')")
        cursor.execute("ANALYZE backwave_job")


def plan(queryset) -> list[dict]:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (document,) = cursor.fetchone()
    root = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    nodes, stack = [], [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", ()))
    return nodes


def job_reads(nodes) -> set[tuple[str, str | None]]:
    return {
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == "backwave_job" or n.get("Index Name", "").startswith("backwave_job")
    }


SEARCHES = [
    ("customer_id=42", "backwave_job_payload"),
    ("customer_id=42 order_id=10042", "backwave_job_payload"),
    ("arg:7", "backwave_job_payload"),
    ("tag:tenant:7", "backwave_job_tags"),
]


def test_the_search_and_the_tag_filter_read_their_gin_indexes(jobs_with_arguments):
    """One test over every search (the 20,000 rows are written once): the changelist's page and
    its bounded count each go through the term's index. Each term matches few rows (10 to 100):
    for a common one (a tag on 2% of the jobs) the planner rightly walks the primary key
    backwards for the page's 50 newest instead, as the report's plans at 1,000,000 rows show."""
    for search, index in SEARCHES:
        matching = job_search.parse(search).apply(Job.objects.all())
        page = matching.order_by("-id")[:50]  # the changelist's page
        count = matching.order_by()[:10_001]  # the bounded count's inner query
        for queryset in (page, count):
            reads = job_reads(plan(queryset))
            assert ("Bitmap Index Scan", index) in reads, (search, reads)
            assert not any(kind == "Seq Scan" for kind, _ in reads), (search, reads)
        assert matching.exists(), search
    # The tag filter beside a state filter, as the changelist combines them.
    reads = job_reads(plan(Job.objects.filter(job_search.tags_condition(["tenant:7"]), state="failed").order_by("-id")[:50]))
    assert ("Bitmap Index Scan", "backwave_job_tags") in reads, reads

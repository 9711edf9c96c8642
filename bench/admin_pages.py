#!/usr/bin/env python
"""Time BackWave's admin pages against a big job table.

    .venv/bin/python bench/admin_pages.py                # 1,000,000 jobs
    .venv/bin/python bench/admin_pages.py --rows 200000 --runs 10

Works in its own database (``<name>_admin_bench`` on the project's server, kept between runs:
``--drop`` removes it), fills ``backwave_job`` with ONE ``INSERT ... SELECT generate_series``
(regenerated when the row count differs, or with ``--fresh``), runs ``VACUUM ANALYZE`` as autovacuum would, then
fetches each admin page with Django's test client as a superuser and prints the median time and
the number of queries. A measurement for people, not a test: run it on an idle machine.

The rows: 95% succeeded, 3% failed, 0.5% quarantined, 0.5% cancelled, 0.9% ready (a third of them
scheduled for later) and 0.1% running; queues default, emails, reports and bench; the five demo
tasks; finish times spread over the last 24 hours (the default retention of succeeded jobs).
Every job that ran has its attempt row (one each, lasting 5 to 500 ms, the failed ones with a
traceback), and maintenance's rollup is run until it has caught up (timed: attempts per second),
so the dashboard and the Task statistics page read what a cluster that ran them would hold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_test_environment  # noqa: E402

GENERATE_SQL = """
INSERT INTO backwave_job (task_path, queue, priority, payload, state, backend, tags, run_at,
                          enqueued_at, started_at, last_attempted_at, finished_at, attempts,
                          max_attempts, backoff_base, backoff_max, lease_id, worker_id)
SELECT (ARRAY['project.demo.tasks.fast_job', 'project.demo.tasks.slow_job',
              'project.demo.tasks.failing_job', 'project.demo.tasks.email_job',
              'project.demo.tasks.report_job'])[1 + (g.i / 7) %% 5],
       (ARRAY['default', 'default', 'default', 'emails', 'emails', 'reports', 'bench'])[1 + g.i %% 7],
       0,
       jsonb_build_object('args', jsonb_build_array(g.i), 'kwargs', '{}'::jsonb),
       s.state, 'default', '{}',
       CASE WHEN s.state = 'ready' AND g.i %% 3 = 0 THEN now() + interval '1 hour' ELSE f.at - interval '1 second' END,
       f.at - interval '2 seconds',
       CASE WHEN s.state <> 'ready' THEN f.at - interval '1 second' END,
       CASE WHEN s.state <> 'ready' THEN f.at - interval '1 second' END,
       CASE WHEN s.state IN ('succeeded', 'failed', 'cancelled', 'quarantined') THEN f.at END,
       CASE WHEN s.state = 'ready' THEN 0 WHEN s.state = 'failed' THEN 3 ELSE 1 END,
       3, 1.0, 3600.0,
       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
       CASE WHEN s.state <> 'ready' THEN 'bench-host:' || (g.i %% 4) || ':default:0' ELSE '' END
FROM generate_series(1, %(rows)s) AS g(i)
CROSS JOIN LATERAL (SELECT CASE
    WHEN g.i %% 1000 < 950 THEN 'succeeded'
    WHEN g.i %% 1000 < 980 THEN 'failed'
    WHEN g.i %% 1000 < 985 THEN 'quarantined'
    WHEN g.i %% 1000 < 990 THEN 'cancelled'
    WHEN g.i %% 1000 < 999 THEN 'ready'
    ELSE 'running' END AS state) AS s
CROSS JOIN LATERAL (SELECT now() - (g.i %% 86400) * interval '1 second' AS at) AS f
"""

# One attempt per job that ran, inserted in finish order (as outcome writes would have).
ATTEMPTS_SQL = """
INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at, error_class, traceback)
SELECT j.id, 1, CASE j.state WHEN 'succeeded' THEN 'succeeded' WHEN 'quarantined' THEN 'quarantined' ELSE 'failed' END,
       j.worker_id, j.finished_at - make_interval(secs => 0.005 + (j.id % 100) * 0.005), j.finished_at,
       CASE WHEN j.state = 'succeeded' THEN '' ELSE 'builtins.RuntimeError' END,
       CASE WHEN j.state = 'succeeded' THEN '' ELSE 'Traceback (most recent call last):' || chr(10) || 'RuntimeError: bench failure ' || j.id END
FROM backwave_job AS j
WHERE j.state IN ('succeeded', 'failed', 'quarantined')
ORDER BY j.finished_at, j.id
"""


def roll_up_all() -> None:
    """Maintenance's rollup, page after page, until it has caught up with every attempt."""
    from backwave.core.maintenance import ROLLUP_BATCH
    from backwave.store.postgres import PostgresStore

    store = PostgresStore.from_django()
    started, total, pages = time.perf_counter(), 0, 0
    while True:
        rolled = store.roll_up_task_stats(limit=ROLLUP_BATCH, settle=0)
        total, pages = total + rolled, pages + 1
        if rolled < ROLLUP_BATCH and pages > 2:
            break
    elapsed = time.perf_counter() - started
    store.close()
    if total:
        print(
            f"rolled up {total:,} attempts in {pages} pages of up to {ROLLUP_BATCH:,} in {elapsed:.1f} s ({total / elapsed:,.0f} attempts/s)"
        )


def prepare(rows: int, fresh: bool) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM backwave_job")
        if cursor.fetchone()[0] == rows and not fresh:
            print(f"reusing the {rows:,} job rows already there")
        else:
            cursor.execute("TRUNCATE backwave_job, backwave_attempt, backwave_pump RESTART IDENTITY CASCADE")
            started = time.perf_counter()
            cursor.execute(GENERATE_SQL, {"rows": rows})
            print(
                f"generated {rows:,} job rows with one INSERT ... SELECT generate_series in {time.perf_counter() - started:.1f} s"
            )
        cursor.execute("DELETE FROM backwave_pump")
        cursor.execute(
            """
            INSERT INTO backwave_pump (worker_id, "group", hostname, pid, status, reason, in_flight, lease_duration, started_at, last_heartbeat_at)
            SELECT 'bench-host:' || n || ':default:0', 'default', 'bench-host', 1000 + n,
                   CASE n WHEN 1 THEN 'halted' WHEN 2 THEN 'degraded' ELSE 'healthy' END,
                   CASE n WHEN 1 THEN 'DriverError: bench' ELSE '' END, 4, 30, now(), now()
            FROM generate_series(1, 8) AS n
            """
        )
        cursor.execute("SELECT id FROM backwave_job WHERE state = 'failed' ORDER BY id LIMIT 1")
        failed_id = cursor.fetchone()[0]
        cursor.execute("DELETE FROM backwave_attempt WHERE job_id = %s", [failed_id])
        cursor.execute(
            """
            INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at, error_class, traceback)
            SELECT %s, n, 'failed', 'bench-host:0:default:0', now() - interval '1 minute', now(),
                   'builtins.RuntimeError', repeat('Traceback line' || chr(10), 40)
            FROM generate_series(1, 3) AS n
            """,
            [failed_id],
        )
        cursor.execute("SELECT count(*) FROM backwave_attempt")
        if cursor.fetchone()[0] < 1000:
            started = time.perf_counter()
            cursor.execute(f"DELETE FROM backwave_attempt WHERE job_id <> {int(failed_id)}")
            cursor.execute("TRUNCATE backwave_task_stat")
            cursor.execute(
                "UPDATE backwave_stats_rollup SET watermark = 0, horizon = 0, horizon_xmax = 0, horizon_at = NULL, rolled_up = 0"
            )
            cursor.execute(ATTEMPTS_SQL.replace("WHERE j.state IN", f"WHERE j.id <> {int(failed_id)} AND j.state IN"))
            print(f"generated {cursor.rowcount:,} attempt rows in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        cursor.execute("VACUUM ANALYZE backwave_job")
        cursor.execute("VACUUM ANALYZE backwave_attempt")
        print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")
    roll_up_all()
    return failed_id


def pages(failed_id: int) -> list[tuple[str, str]]:
    jobs = "/admin/backwave/job/"
    return [
        ("Queues", "/admin/backwave/queue/"),
        ("Jobs", jobs),
        ("Jobs, state=failed", f"{jobs}?state=failed"),
        ("Jobs, queue=emails & state=quarantined", f"{jobs}?queue=emails&state=quarantined"),
        ("Jobs, task=report_job", f"{jobs}?task=project.demo.tasks.report_job"),
        ("Jobs, search by id", f"{jobs}?q={failed_id}"),
        ("Jobs, search 'report'", f"{jobs}?q=report"),
        ("Jobs, page 50", f"{jobs}?p=50"),
        ("Job detail (3 attempts)", f"{jobs}{failed_id}/change/"),
        ("Pumps", "/admin/backwave/pump/"),
        ("Schedules", "/admin/backwave/schedule/"),
        ("Dashboard (1 h)", "/admin/backwave/"),
        ("Dashboard (24 h)", "/admin/backwave/?range=24h"),
        ("Task statistics (24 h)", "/admin/backwave/taskstat/"),
        ("Task statistics (7 d)", "/admin/backwave/taskstat/?range=7d"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5, help="timed fetches per page (after one warm-up)")
    parser.add_argument(
        "--fresh", action="store_true", help="regenerate the rows even when the count matches (finish times are relative to now)"
    )
    parser.add_argument("--drop", action="store_true", help="drop the bench database afterwards")
    args = parser.parse_args()

    from django.contrib.auth.models import User
    from django.test import Client

    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = f"{settings.DATABASES['default']['NAME']}_admin_bench"
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    setup_test_environment()
    old_name = settings.DATABASES["default"]["NAME"]
    connection.creation.create_test_db(verbosity=0, keepdb=True)
    try:
        failed_id = prepare(args.rows, args.fresh)
        user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
        client = Client()
        client.force_login(user)
        print(f"\n{'page':<42} {'median ms':>10} {'max ms':>8} {'queries':>8}")
        for name, url in pages(failed_id):
            response = client.get(url)  # warm-up
            assert response.status_code == 200, (url, response.status_code)
            times = []
            for _ in range(args.runs):
                with CaptureQueriesContext(connection) as queries:
                    started = time.perf_counter()
                    client.get(url)
                    times.append((time.perf_counter() - started) * 1000)
            print(f"{name:<42} {statistics.median(times):>10.1f} {max(times):>8.1f} {len(queries):>8}")
    finally:
        if args.drop:
            connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)


if __name__ == "__main__":
    main()

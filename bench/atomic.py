#!/usr/bin/env python
"""Atomic tasks beside plain ones, in the same run: what effect-once costs.

    .venv/bin/python bench/atomic.py                      # 10,000 jobs each, pool 16, pumps 1
    .venv/bin/python bench/atomic.py --jobs 5000 --work noop --rounds 3

Each job does the same database work (``--work insert``: one INSERT into the benchmark's own
table, ``noop``: nothing), once as a plain task (its write commits on its own, its outcome is
written later in a batch) and once as ``atomic=True`` (the write and the fenced outcome commit
together: one outcome statement and one transaction per job, not batched). Rounds alternate
plain and atomic so a machine whose load drifts hurts both alike. For each it enqueues the jobs
in one INSERT, drains them with one ``manage.py backwave_worker --until-idle`` and reads the rate
from the database clock (first attempt's start to last attempt's end), as bench/throughput.py
does. A benchmark, not a test: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from backwave.tasking.task import enqueue_many  # noqa: E402
from project.demo.tasks import BENCH_EFFECTS, noop, noop_atomically, write_effect, write_effect_atomically  # noqa: E402

QUEUE = "bench"


def reset() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {BENCH_EFFECTS} (n bigint NOT NULL)")
        cursor.execute(f"TRUNCATE {BENCH_EFFECTS}")
        cursor.execute("DELETE FROM backwave_job WHERE queue = %s", [QUEUE])
        cursor.execute("VACUUM ANALYZE backwave_job")
        cursor.execute("VACUUM ANALYZE backwave_attempt")


def run_once(task, jobs: int, pool_size: int, pumps: int, claim_batch: int) -> dict:
    reset()
    enqueue_many([(task, (i,), {}) for i in range(jobs)])
    command = [
        sys.executable,
        "manage.py",
        "backwave_worker",
        "--queues",
        QUEUE,
        "--pool-size",
        str(pool_size),
        "--pumps",
        str(pumps),
        "--max-claim-batch",
        str(claim_batch),
        "--until-idle",
        "--log-every",
        "1",
    ]
    wall = time.perf_counter()
    finished = subprocess.run(command, cwd=ROOT, env={**os.environ, "BACKWAVE_LOG_LEVEL": "INFO"}, capture_output=True, text=True)
    wall = time.perf_counter() - wall
    if finished.returncode != 0:
        sys.exit(f"worker failed ({finished.returncode}):\n{finished.stdout}\n{finished.stderr}")
    log = finished.stdout + finished.stderr
    round_trips = (
        sum(int(m.group(2)) for m in re.finditer(r"stopped after (\d+) job\(s\) and (\d+) store round-trips", log)) or -1
    )
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE j.state = 'succeeded'), count(*),
                   extract(epoch FROM max(a.finished_at) - min(a.started_at))
            FROM backwave_job j JOIN backwave_attempt a ON a.job_id = j.id
            WHERE j.queue = %s
            """,
            [QUEUE],
        )
        succeeded, attempts, drain_seconds = cursor.fetchone()
        cursor.execute(f"SELECT count(*) FROM {BENCH_EFFECTS}")
        (effects,) = cursor.fetchone()
    if succeeded != jobs or attempts != jobs:
        sys.exit(f"expected {jobs} jobs succeeded once each, got {succeeded} succeeded and {attempts} attempts")
    return {
        "jobs_per_second": succeeded / float(drain_seconds),
        "drain_seconds": float(drain_seconds),
        "wall": wall,
        "round_trips_per_job": round_trips / succeeded,
        "effects": effects,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--pumps", type=int, default=1)
    parser.add_argument("--max-claim-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="plain, atomic pairs (the median of each is compared)")
    parser.add_argument("--work", choices=["insert", "noop"], default="insert")
    args = parser.parse_args()
    plain, atomic = (write_effect, write_effect_atomically) if args.work == "insert" else (noop, noop_atomically)
    print(
        f"{args.jobs} jobs ({args.work}) per run, pool {args.pool_size}, pumps {args.pumps}, claim batch {args.max_claim_batch}"
    )
    print(f"{'run':>8} {'round':>5} {'drain s':>8} {'jobs/s':>8} {'rt/job':>7} {'effects':>8}")
    rates: dict[str, list[float]] = {"plain": [], "atomic": []}
    for number in range(1, args.rounds + 1):
        for name, task in (("plain", plain), ("atomic", atomic)):
            r = run_once(task, args.jobs, args.pool_size, args.pumps, args.max_claim_batch)
            rates[name].append(r["jobs_per_second"])
            print(
                f"{name:>8} {number:>5} {r['drain_seconds']:>8.2f} {r['jobs_per_second']:>8.0f} {r['round_trips_per_job']:>7.3f} {r['effects']:>8}"
            )
    plain_rate, atomic_rate = statistics.median(rates["plain"]), statistics.median(rates["atomic"])
    print(
        f"median: plain {plain_rate:.0f} jobs/s, atomic {atomic_rate:.0f} jobs/s: atomic at {atomic_rate / plain_rate:.0%} of plain (target >= 40%)"
    )
    reset()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {BENCH_EFFECTS}")


if __name__ == "__main__":
    main()

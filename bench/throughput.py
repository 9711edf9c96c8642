#!/usr/bin/env python
"""BackWave throughput benchmark: enqueue N no-op tasks, drain them with one worker process.

    .venv/bin/python bench/throughput.py                 # 20,000 jobs, pool 16, pumps 1, 2, 4
    .venv/bin/python bench/throughput.py --jobs 5000 --pumps 1 --pool-size 32

For each pump count it clears the ``bench`` queue, enqueues the jobs in one INSERT (timed), then
runs ``manage.py backwave_worker --until-idle`` in a subprocess and reads the drain rate from the
database clock (first claim to last finish) and the store round-trips the worker reports. A
benchmark, not a test: run it by hand on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import re
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

from backwave.models import Job  # noqa: E402
from backwave.tasking.task import enqueue_many  # noqa: E402
from project.demo.tasks import noop, slow_job  # noqa: E402  (noop is on queue "bench")

QUEUE = "bench"


def clear_queue() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM backwave_job WHERE queue = %s", [QUEUE])
        cursor.execute("VACUUM ANALYZE backwave_job")
        cursor.execute("VACUUM ANALYZE backwave_attempt")


def run_once(jobs: int, pool_size: int, pumps: int, claim_batch: int, sleep_ms: float = 0.0, processes: int = 1) -> dict:
    clear_queue()
    if sleep_ms:
        calls = [(slow_job.using(queue_name=QUEUE), (sleep_ms / 1000,), {}) for _ in range(jobs)]
    else:
        calls = [(noop, (i,), {}) for i in range(jobs)]
    started = time.perf_counter()
    enqueue_many(calls)
    enqueue_seconds = time.perf_counter() - started

    command = [
        sys.executable, "manage.py", "backwave_worker", "--queues", QUEUE, "--pool-size", str(pool_size),
        "--pumps", str(pumps), "--max-claim-batch", str(claim_batch), "--until-idle", "--log-every", "1",
    ]
    if processes > 1:
        # Children run --until-idle each; the supervisor exits when all of them have.
        command += ["--processes", str(processes)]
    env = {**os.environ, "BACKWAVE_LOG_LEVEL": "INFO"}
    wall = time.perf_counter()
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - wall
    if finished.returncode != 0:
        sys.exit(f"worker failed ({finished.returncode}):\n{finished.stdout}\n{finished.stderr}")
    log = finished.stdout + finished.stderr
    round_trips = sum(int(m.group(2)) for m in re.finditer(r"stopped after (\d+) job\(s\) and (\d+) store round-trips", log)) or -1

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*), count(*) FILTER (WHERE j.state = 'succeeded'),
                   extract(epoch FROM max(a.finished_at) - min(a.started_at))
            FROM backwave_job j JOIN backwave_attempt a ON a.job_id = j.id
            WHERE j.queue = %s
            """,
            [QUEUE],
        )
        attempts, succeeded, drain_seconds = cursor.fetchone()
    clear_queue()
    return {
        "pumps": pumps,
        "enqueue_rate": jobs / enqueue_seconds,
        "enqueue_seconds": enqueue_seconds,
        "succeeded": succeeded,
        "attempts": attempts,
        "drain_seconds": float(drain_seconds),
        "jobs_per_second": succeeded / float(drain_seconds),
        "process_seconds": wall,
        "round_trips_per_job": round_trips / max(succeeded, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--pumps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--max-claim-batch", type=int, default=32)
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="jobs sleep this long instead of doing nothing")
    parser.add_argument("--processes", type=int, default=1, help="worker processes under the supervisor")
    args = parser.parse_args()
    kind = f"{args.sleep_ms:g} ms sleeping" if args.sleep_ms else "no-op"
    print(f"{args.jobs} {kind} jobs, processes {args.processes}, pool {args.pool_size}, claim batch {args.max_claim_batch}, database {connection.settings_dict['HOST'] or 'local'}")
    print(f"{'pumps':>5} {'enqueue s':>10} {'enqueue/s':>10} {'drain s':>8} {'jobs/s':>8} {'rt/job':>7} {'ok':>6}")
    for pumps in args.pumps:
        r = run_once(args.jobs, args.pool_size, pumps, args.max_claim_batch, args.sleep_ms, args.processes)
        print(
            f"{r['pumps']:>5} {r['enqueue_seconds']:>10.2f} {r['enqueue_rate']:>10.0f} {r['drain_seconds']:>8.2f} "
            f"{r['jobs_per_second']:>8.0f} {r['round_trips_per_job']:>7.3f} {r['succeeded']:>6}"
        )
        if args.sleep_ms:
            ideal = args.jobs * args.sleep_ms / 1000 / (args.pool_size * pumps * args.processes)
            print(f"      ideal {ideal:.2f} s: efficiency {ideal / r['drain_seconds']:.0%}")
        if r["succeeded"] != args.jobs or r["attempts"] != args.jobs:
            sys.exit(f"expected {args.jobs} jobs succeeded once each, got {r['succeeded']} succeeded and {r['attempts']} attempts")


if __name__ == "__main__":
    main()

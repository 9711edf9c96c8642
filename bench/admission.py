#!/usr/bin/env python
"""Admission benchmark: each feature beside the plain baseline, measured in the same run.

    .venv/bin/python bench/admission.py                 # 20,000 jobs, pool 16, one pump
    .venv/bin/python bench/admission.py --jobs 5000 --rounds 3

* Enqueue: 20,000 plain no-op jobs in one enqueue_many, then 20,000 with a uniqueness key on
  every job (all new keys), each timed; the issue asks for unique within 2x of plain.
* Drain: 20,000 plain jobs drained by ``manage.py backwave_worker --until-idle``, then 20,000
  under a per-key limit of 1 over 100 keys; the issue asks for >= 70% of the plain rate. Rates
  come from the database clock (first start to last finish), as in bench/throughput.py.

Rounds alternate plain and feature so that load from elsewhere hits both alike; the best round
of each is printed. A benchmark, not a test: run it on an otherwise idle machine, and print
``uptime`` beside the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.admission_settings"

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from backwave.tasking.task import enqueue_many  # noqa: E402
from bench.admission_tasks import keyed_noop, unique_noop  # noqa: E402
from project.demo.tasks import noop  # noqa: E402  (on queue "bench")

QUEUES = ("bench", "bench-keyed")


def clear() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM backwave_attempt WHERE job_id IN (SELECT id FROM backwave_job WHERE queue = ANY(%s))", [list(QUEUES)]
        )
        cursor.execute("DELETE FROM backwave_job WHERE queue = ANY(%s)", [list(QUEUES)])
        cursor.execute("VACUUM ANALYZE backwave_job")
        cursor.execute("VACUUM ANALYZE backwave_attempt")


def timed_enqueue(calls) -> float:
    started = time.perf_counter()
    enqueue_many(calls)
    return time.perf_counter() - started


def drain(queue: str, pool_size: int) -> float:
    """Drain ``queue`` with one worker process; jobs per second by the database clock."""
    command = [
        sys.executable,
        "manage.py",
        "backwave_worker",
        "--queues",
        queue,
        "--pool-size",
        str(pool_size),
        "--until-idle",
        "--log-every",
        "5",
    ]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.admission_settings", "BACKWAVE_LOG_LEVEL": "WARNING"}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if finished.returncode != 0:
        sys.exit(f"worker failed ({finished.returncode}):\n{finished.stdout}\n{finished.stderr}")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*),"
            " extract(epoch FROM max(finished_at) - min(started_at)) FROM backwave_job WHERE queue = %s",
            [queue],
        )
        succeeded, total, seconds = cursor.fetchone()
    if succeeded != total:
        sys.exit(f"{queue}: {succeeded} of {total} jobs succeeded")
    return succeeded / float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(
        f"{args.jobs} jobs, {args.rounds} rounds (best shown), pool {args.pool_size}, database {connection.settings_dict['HOST'] or 'local'}"
    )

    plain_enqueue, unique_enqueue, plain_drain, keyed_drain = [], [], [], []
    for _ in range(args.rounds):
        clear()
        plain_enqueue.append(timed_enqueue([(noop, (n,), {}) for n in range(args.jobs)]))
        clear()
        unique_enqueue.append(timed_enqueue([(unique_noop, (n,), {}) for n in range(args.jobs)]))
        clear()
        enqueue_many([(noop, (n,), {}) for n in range(args.jobs)])
        plain_drain.append(drain("bench", args.pool_size))
        clear()
        enqueue_many([(keyed_noop, (f"customer-{n % args.keys}", n), {}) for n in range(args.jobs)])
        keyed_drain.append(drain("bench-keyed", args.pool_size))
        clear()

    plain_e, unique_e = min(plain_enqueue), min(unique_enqueue)
    plain_d, keyed_d = max(plain_drain), max(keyed_drain)
    print(
        f"enqueue {args.jobs:,}: plain {plain_e:.2f} s ({args.jobs / plain_e:,.0f}/s), unique key on every job {unique_e:.2f} s"
        f" ({args.jobs / unique_e:,.0f}/s): {unique_e / plain_e:.2f}x plain (target <= 2x)"
    )
    print(
        f"drain {args.jobs:,}: plain {plain_d:,.0f} jobs/s, per-key limit 1 over {args.keys} keys {keyed_d:,.0f} jobs/s:"
        f" {keyed_d / plain_d:.0%} of plain (target >= 70%)"
    )
    print(
        "rounds: enqueue plain "
        + ", ".join(f"{s:.2f}" for s in plain_enqueue)
        + "; unique "
        + ", ".join(f"{s:.2f}" for s in unique_enqueue)
        + "; drain plain "
        + ", ".join(f"{r:.0f}" for r in plain_drain)
        + "; keyed "
        + ", ".join(f"{r:.0f}" for r in keyed_drain)
    )


if __name__ == "__main__":
    main()

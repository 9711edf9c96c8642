#!/usr/bin/env python
"""Enqueue-to-start latency: N jobs enqueued one at a time, some milliseconds apart, to an idle worker.

    .venv/bin/python bench/latency.py                # 200 jobs, 20 ms apart, with hints and without

Latency is the job's claim time minus its enqueue time, both stamped by the database clock
(``last_attempted_at - enqueued_at``), so neither process's clock nor the benchmark's own overhead
enters it. A benchmark, not a test: run it by hand on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
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

from backwave.models import Job, Lease  # noqa: E402
from project.demo.tasks import noop  # noqa: E402  (queue "bench")


def measure(jobs: int, gap: float, hints: bool, poll_interval: float) -> list[float]:
    Job.objects.filter(queue="bench").delete()
    command = [sys.executable, "manage.py", "backwave_worker", "--queues", "bench", "--pool-size", "16",
               "--poll-interval", str(poll_interval), "--log-every", "3600"]
    if not hints:
        command.append("--no-hints")
    worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not Lease.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(max(1.0, poll_interval))  # idle: the first claims have come back empty
        for i in range(jobs):
            noop.enqueue(i)
            time.sleep(gap)
        deadline = time.monotonic() + 60
        while Job.objects.filter(queue="bench").exclude(state="succeeded").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(30)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM last_attempted_at - enqueued_at) * 1000 FROM backwave_job WHERE queue = 'bench' AND state = 'succeeded'"
        )
        latencies = sorted(row[0] for row in cursor.fetchall())
    Job.objects.filter(queue="bench").delete()
    return [float(v) for v in latencies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    for hints in (True, False):
        latencies = measure(args.jobs, args.gap_ms / 1000, hints, args.poll_interval)
        if len(latencies) != args.jobs:
            sys.exit(f"only {len(latencies)} of {args.jobs} jobs ran")
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"hints {'on ' if hints else 'off'}: p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  max {latencies[-1]:7.2f} ms  (poll_interval {args.poll_interval} s)")


if __name__ == "__main__":
    main()

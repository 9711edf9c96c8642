#!/usr/bin/env python
"""Enqueue-to-claim latency through ``task.enqueue()`` to an idle worker, BackWave beside the bare
loop (bench/bare.py ``listen``: LISTEN on BackWave's hint channel, claim on each hint).

    python bench/latency.py                  # 200 jobs 20 ms apart, then a burst: 4 threads, one job each every 5 ms, 2 s
    python bench/latency.py --quick          # 100 jobs, a 1 s burst

Latency is the job's claim time minus its enqueue time, both stamped by the database clock
(``last_attempted_at - enqueued_at``), so neither process's clock nor the benchmark's own overhead
enters it. The enqueue call itself is timed on the client (p50). Both contenders get the very
same enqueues (``noop.enqueue``, hints on: a NOTIFY per committed enqueue).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time

from common import QUEUE, ROOT, WORKER_ROOT, bare_command, reset, sql, uptime_line, worker_command, worker_env

from project.demo.tasks import noop

from backwave.models import Lease


def _start(contender: str) -> subprocess.Popen:
    if contender == "bare":
        process = subprocess.Popen(bare_command("listen"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        process.stdout.readline()  # "listening"
        return process
    command = worker_command(pool_size=16, until_idle=False, extra=("--poll-interval", "1"))
    process = subprocess.Popen(command, cwd=WORKER_ROOT, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not Lease.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return process


def measure(contender: str, *, jobs: int, gap: float, burst_seconds: float, threads: int = 4, burst_gap: float = 0.005) -> dict:
    reset()
    process = _start(contender)
    try:
        time.sleep(1.5)  # idle: the first claims have come back empty, the worker waits for hints
        calls = []
        for i in range(jobs):
            began = time.perf_counter()
            noop.enqueue(i)
            calls.append(time.perf_counter() - began)
            time.sleep(gap)
        _wait_done(jobs)
        idle = _latencies()
        sql("DELETE FROM backwave_job WHERE queue = %s", [QUEUE])
        time.sleep(1.0)
        stop = time.monotonic() + burst_seconds

        def enqueue_every():
            from django.db import connection

            while time.monotonic() < stop:
                noop.enqueue(0)
                time.sleep(burst_gap)
            connection.close()

        workers = [threading.Thread(target=enqueue_every) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        burst_jobs = sql("SELECT count(*) FROM backwave_job WHERE queue = %s", [QUEUE])[0][0]
        _wait_done(burst_jobs)
        burst = _latencies()
    finally:
        process.terminate()
        process.wait(30)
    return {"contender": contender, "idle": idle, "burst": burst, "enqueue_p50": statistics.median(calls) * 1000}


def _wait_done(jobs: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sql("SELECT count(*) FROM backwave_job WHERE queue = %s AND state = 'succeeded'", [QUEUE])[0][0] >= jobs:
            return
        time.sleep(0.05)
    raise SystemExit(f"only some of {jobs} jobs ran within 60 s")


def _latencies() -> list[float]:
    rows = sql(
        "SELECT extract(epoch FROM last_attempted_at - enqueued_at) * 1000 FROM backwave_job WHERE queue = %s AND state = 'succeeded'",
        [QUEUE],
    )
    return sorted(float(row[0]) for row in rows)


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    jobs = args.jobs or (100 if args.quick else 200)
    burst_seconds = 1.0 if args.quick else 2.0
    print(
        f"latency: {jobs} jobs {args.gap_ms:g} ms apart to an idle worker, then 4 threads x one job per 5 ms for {burst_seconds:g} s; {uptime_line()}"
    )
    print(
        f"{'contender':<10} {'idle p50':>9} {'idle p99':>9} {'idle max':>9} {'burst jobs':>10} {'burst p50':>10} {'burst p99':>10} {'enqueue p50':>12}"
    )
    results = {c: measure(c, jobs=jobs, gap=args.gap_ms / 1000, burst_seconds=burst_seconds) for c in ("bare", "backwave")}
    for r in results.values():
        idle, burst = r["idle"], r["burst"]
        print(
            f"{r['contender']:<10} {statistics.median(idle):>7.2f}ms {percentile(idle, 0.99):>7.2f}ms {idle[-1]:>7.2f}ms {len(burst):>10} "
            f"{statistics.median(burst):>8.2f}ms {percentile(burst, 0.99):>8.2f}ms {r['enqueue_p50']:>10.2f}ms"
        )
    ours, bare = results["backwave"], results["bare"]
    return [
        {
            "benchmark": "latency",
            "what": f"idle p50 ms (bare {statistics.median(bare['idle']):.2f})",
            "value": statistics.median(ours["idle"]),
            "goal": 3.0,
            "unit": "ms",
            "below": True,
        },
        {
            "benchmark": "latency",
            "what": f"idle p99 ms (bare {percentile(bare['idle'], 0.99):.2f})",
            "value": percentile(ours["idle"], 0.99),
            "goal": 5.0,
            "unit": "ms",
            "below": True,
        },
        {
            "benchmark": "latency",
            "what": f"burst p99 ms (bare {percentile(bare['burst'], 0.99):.2f})",
            "value": percentile(ours["burst"], 0.99),
            "goal": 10.0,
            "unit": "ms",
            "below": True,
        },
    ]


if __name__ == "__main__":
    main()

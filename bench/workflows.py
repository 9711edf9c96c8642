#!/usr/bin/env python
"""BackWave workflow benchmark: a chain and a fan-out/fan-in against the no-dependency rate.

    .venv/bin/python bench/workflows.py                  # chain of 10,000; fan-out of 20,000 + 1
    .venv/bin/python bench/workflows.py --chain 2000 --fan-out 5000 --repeat 3

Each shape is measured beside its own baseline, in the same run, with the same worker options:
the baseline is as many no-op jobs with no dependency (one INSERT), the shape the same no-op
jobs enqueued with one statement as a chain (each after the one before) or as a fan-out with one
fan-in (after all of them). Rates are read from the database clock (first attempt's start to
the last one's end), as bench/throughput.py reads them; wake-up hints are on (a worker always
listens). Targets (issue 11): chain >= 50% of its baseline, fan-out >= 90%. A benchmark, not a
test: run it by hand, on an otherwise idle machine for figures worth quoting.

The chain is also run by the bare loop (bench/bare.py chain: one statement completes a link and
claims the next, one durable commit a link, jobs inline, no attempt rows), the least a chain on
this table can cost: its rate against the no-dependency one is the ceiling of the first ratio
for any job system that commits each link before the next one runs, and BackWave's chain is
printed against it too.
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

from backwave.tasking.task import enqueue_many  # noqa: E402
from common import bare_command, drain_figures, ran_once  # noqa: E402  (bench/, beside this file)
from backwave.tasking.workflow import chain, group  # noqa: E402
from project.demo.tasks import noop  # noqa: E402  (noop is on queue "bench")

QUEUE = "bench"


def clear_queue() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM backwave_job WHERE queue = %s", [QUEUE])
        cursor.execute("VACUUM ANALYZE backwave_job")
        cursor.execute("VACUUM ANALYZE backwave_attempt")
        cursor.execute("VACUUM ANALYZE backwave_dependency")


def enqueue(shape: str, jobs: int) -> float:
    """Enqueue the shape; returns the seconds the enqueue took."""
    calls = [(noop, (i,), {}) for i in range(jobs)]
    started = time.perf_counter()
    if shape == "chain":
        chain(*calls)
    elif shape == "fan-out":
        group(calls[:-1], then=calls[-1])
    else:
        enqueue_many(calls)
    return time.perf_counter() - started


def run_or_exit(what: str, command: list[str], env: dict[str, str] | None = None) -> None:
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if finished.returncode != 0:
        sys.exit(f"{what} failed ({finished.returncode}):\n{finished.stdout}\n{finished.stderr}")


def drain(args) -> tuple[int, int, float]:
    """Run one worker until idle; (succeeded, attempts, drain seconds by the database clock)."""
    command = [
        sys.executable,
        "manage.py",
        "backwave_worker",
        "--queues",
        QUEUE,
        "--pool-size",
        str(args.pool_size),
        "--pumps",
        str(args.pumps),
        "--max-claim-batch",
        str(args.max_claim_batch),
        "--until-idle",
        "--log-every",
        "1",
    ]
    run_or_exit("worker", command, env={**os.environ, "BACKWAVE_LOG_LEVEL": "INFO"})
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(DISTINCT j.id) FILTER (WHERE j.state = 'succeeded'), count(a.*),
                   extract(epoch FROM max(a.finished_at) - min(a.started_at))
            FROM backwave_job AS j JOIN backwave_attempt AS a ON a.job_id = j.id
            WHERE j.queue = %s
            """,
            [QUEUE],
        )
        succeeded, attempts, seconds = cursor.fetchone()
    return succeeded, attempts, float(seconds)


def bare_chain(jobs: int) -> float:
    """The chain drained by the bare loop; its rate by the database clock (first claim to last
    finish, as the other benchmarks read the bare loop's)."""
    clear_queue()
    enqueue("chain", jobs)
    run_or_exit("bare chain", bare_command("chain", "--queue", QUEUE))
    if problem := ran_once(jobs):
        sys.exit(f"bare chain: {problem}")
    figures = drain_figures()
    clear_queue()
    print(f"  {'bare chain':<13} {jobs:>7,} jobs                  drain {figures.seconds:7.2f} s  {figures.rate:8,.0f} jobs/s")
    return figures.rate


def measure(shape: str, jobs: int, args) -> float:
    clear_queue()
    enqueue_seconds = enqueue(shape, jobs)
    succeeded, attempts, seconds = drain(args)
    clear_queue()
    if succeeded != jobs or attempts != jobs:
        sys.exit(f"{shape}: expected {jobs} jobs succeeded once each, got {succeeded} succeeded and {attempts} attempts")
    rate = jobs / seconds
    print(f"  {shape:<13} {jobs:>7,} jobs  enqueue {enqueue_seconds:6.2f} s  drain {seconds:7.2f} s  {rate:8,.0f} jobs/s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chain", type=int, default=10_000, help="jobs in the chain (0: skip)")
    parser.add_argument("--fan-out", type=int, default=20_000, help="jobs fanned out before the one fan-in (0: skip)")
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--pumps", type=int, default=1)
    parser.add_argument("--max-claim-batch", type=int, default=32)
    parser.add_argument(
        "--repeat", type=int, default=1, help="alternate baseline and shape this many times; medians are compared"
    )
    args = parser.parse_args()
    print(
        f"pool {args.pool_size}, pumps {args.pumps}, claim batch {args.max_claim_batch}, hints on, "
        f"database {connection.settings_dict['HOST'] or 'local'}; load {os.getloadavg()[0]:.2f}"
    )
    shapes = [("chain", args.chain, 0.50), ("fan-out", args.fan_out + 1, 0.90)]
    verdicts = []
    for shape, jobs, target in shapes:
        if jobs <= 1:
            continue
        baselines, rates, bare = [], [], []
        for _ in range(args.repeat):
            baselines.append(measure("no dependency", jobs, args))
            rates.append(measure(shape, jobs, args))
            if shape == "chain":
                bare.append(bare_chain(jobs))
        baseline, rate = statistics.median(baselines), statistics.median(rates)
        ratio = rate / baseline
        verdict = "meets" if ratio >= target else "MISSES"
        verdicts.append(ratio >= target)
        print(
            f"{shape}: {rate:,.0f} jobs/s against {baseline:,.0f} without dependencies = {ratio:.0%} ({verdict} the {target:.0%} target)"
        )
        if bare:
            ceiling = statistics.median(bare)
            print(
                f"  the bare chain: {ceiling:,.0f} jobs/s = {ceiling / baseline:.0%} of the no-dependency rate (the ceiling of that ratio "
                f"with a commit a link); BackWave's chain = {rate / ceiling:.0%} of the bare chain"
            )
    sys.exit(0 if all(verdicts) else 1)


if __name__ == "__main__":
    main()

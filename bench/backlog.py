#!/usr/bin/env python
"""Scale: the drain rate over the head of a large backlog, and beside a table of finished rows,
against the same number of jobs in an otherwise empty table; autovacuum off on the job and
attempt tables throughout (a CI server may run without it), so nothing cleans up but BackWave.

    python bench/backlog.py            # 100,000 jobs: alone; at the head of 1,000,000; beside 1,000,000 finished rows
    python bench/backlog.py --quick    # 20,000 and 200,000
    python bench/backlog.py --repeat 3 # the three cases in turn, three times (each round starting one case later); medians

One worker process, pool 16, durable commits. The worker is stopped (SIGTERM: it drains) once
the head has finished; the rate is the head's (first claim to its last finish, database clock).
Beside each case, the bare loop (bench/bare.py, one process) drains the same head of the same
table, refilled: its own ratio to its empty table's is what the database alone loses there.
Then EXPLAIN (ANALYZE, BUFFERS) of the claim as it runs now, in a transaction rolled back: the
buffers it touches show whether it walks the dead index entries the head left behind.
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from common import (
    QUEUE,
    bare_command,
    drain_figures,
    fill,
    reset,
    run,
    run_many,
    set_autovacuum,
    sql,
    succeeded_count,
    uptime_line,
    worker_command,
    worker_env,
)

from django.db import connection, transaction

from backwave.store.queries import QUERIES
from project.demo.tasks import noop


def prepare(case: str, head: int, backlog: int) -> None:
    reset()
    if case.startswith("beside"):
        fill(noop.using(queue_name="reports"), [0], backlog, state="succeeded")
    fill(noop, [0], backlog if case.startswith("head") else head)
    # A backlog that built up over time has been checkpointed; one made by a single INSERT a
    # moment ago would have its WAL flushed by the checkpointer during the drain, and the drain
    # pay for the fill. Fresh statistics, as autovacuum's analyze is off too.
    sql("ANALYZE backwave_job")
    sql("CHECKPOINT")


def drain_head(head: int) -> float:
    # The stop condition polls every 50 ms while the worker drains. A count of the queue's
    # succeeded jobs reads the whole finished index (state, finished_at): 138 ms a poll beside a
    # million finished rows, a core of the server's busy counting, and that case measured at 66%
    # of the empty table's. So the poll probes one job by its primary key (two batches past the
    # head in claim order: once it has finished, the head has been claimed), and the count runs
    # only after that probe, to confirm.
    ((probe,),) = sql(
        "SELECT id FROM backwave_job WHERE queue = %s AND state = 'ready' ORDER BY priority DESC, run_at, id"
        " OFFSET least(%s, (SELECT count(*) - 1 FROM backwave_job WHERE queue = %s AND state = 'ready')) LIMIT 1",
        [QUEUE, head + 32, QUEUE],
    )

    def head_done() -> bool:
        ((state,),) = sql("SELECT state FROM backwave_job WHERE id = %s", [probe])
        return state == "succeeded" and succeeded_count() >= head

    run(worker_command(pool_size=16, until_idle=False), worker_env(), stop_when=head_done)
    figures = drain_figures(first=head)
    if figures.jobs < head:
        raise SystemExit(f"only {figures.jobs} of the head's {head} jobs finished")
    return figures.rate


def bare_head(head: int) -> float:
    """The bare loop's rate over the first ``head`` jobs of the table as it stands."""
    run_many([bare_command("drain", "--jobs", str(head))])
    figures = drain_figures(first=head)
    if figures.jobs < head:
        raise SystemExit(f"the bare loop finished only {figures.jobs} of the head's {head} jobs")
    return figures.rate


def explain_claim() -> list[str]:
    """The claim's plan with its buffers, as a pump would run it now (rolled back)."""
    lease = uuid.uuid4()
    lines: list[str] = []
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                'INSERT INTO backwave_lease (id, worker_id, "group", hostname, pid, created_at, renewed_at, expires_at) '
                "VALUES (%s, 'bench', 'bench', 'bench', 0, now(), now(), now() + interval '1 minute')",
                [lease],
            )
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + QUERIES["claim_jobs_one_queue"],
                {"lease_id": lease, "worker_id": "bench", "limit": 16, "queue": "bench"},
            )
            lines = [row[0] for row in cursor.fetchall()]
            raise _RolledBack
    except _RolledBack:
        pass
    return lines


class _RolledBack(Exception):
    pass


def buffers_of_claim_scan(plan: list[str]) -> str:
    """The Buffers line under the claim index's scan, and the plan's execution time."""
    found = []
    for i, line in enumerate(plan):
        if "backwave_job_claim on backwave_job" in line:
            for following in plan[i + 1 : i + 5]:
                if "Buffers:" in following:
                    found.append(following.strip())
                    break
        if line.startswith("Execution Time"):
            found.append(line.strip())
    return "; ".join(found)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--head", type=int, default=None)
    parser.add_argument("--backlog", type=int, default=None)
    parser.add_argument("--plans", action="store_true", help="print the whole EXPLAIN of each case")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the three cases in turn this many times and compare their medians (the empty table's rate moves by 15%% from "
        "one run to the next on a shared 2-core machine, as much as the goals' margins)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    head = args.head or (20_000 if args.quick else 100_000)
    backlog = args.backlog or (200_000 if args.quick else 1_000_000)
    print(f"backlog: the rate over {head:,} jobs, autovacuum off; {uptime_line()}")
    cases = ("empty table", f"head of {backlog:,} ready", f"beside {backlog:,} finished")
    runs: dict[str, list[float]] = {case: [] for case in cases}
    bare_runs: dict[str, list[float]] = {case: [] for case in cases}
    set_autovacuum(False)
    try:
        for round_number in range(1, args.repeat + 1):
            # Each round starts one case later than the last, so no case always runs first (or
            # always right after a million-row fill).
            shift = (round_number - 1) % len(cases)
            plans: dict[str, list[str]] = {}
            for case in cases[shift:] + cases[:shift]:
                prepare(case, head, backlog)
                runs[case].append(drain_head(head))
                plans[case] = explain_claim()
                prepare(case, head, backlog)
                bare_runs[case].append(bare_head(head))
            for case in cases:
                rate, bare_rate = runs[case][-1], bare_runs[case][-1]
                label = f"{case} (run {round_number})" if args.repeat > 1 else case
                print(
                    f"{label:<34} {rate:>8.0f} jobs/s  {rate / runs['empty table'][-1]:>5.0%} of the empty table's   "
                    f"bare loop {bare_rate:>6.0f} jobs/s  {bare_rate / bare_runs['empty table'][-1]:>5.0%}   "
                    f"claim now: {buffers_of_claim_scan(plans[case])}"
                )
                if args.plans:
                    print("\n".join("    " + line for line in plans[case]))
    finally:
        reset()
        set_autovacuum(True)
    rates = {case: statistics.median(values) for case, values in runs.items()}
    bare_rates = {case: statistics.median(values) for case, values in bare_runs.items()}
    if args.repeat > 1:
        for case in cases:
            print(
                f"{case + ' (median)':<34} {rates[case]:>8.0f} jobs/s  {rates[case] / rates['empty table']:>5.0%} of the empty table's   "
                f"bare loop {bare_rates[case]:>6.0f} jobs/s  {bare_rates[case] / bare_rates['empty table']:>5.0%}"
            )
    empty = rates["empty table"]
    ready_case, finished_case = list(rates)[1:]
    bare_empty = bare_rates["empty table"]
    return [
        {
            "benchmark": "backlog",
            "what": f"rate over {head:,} at the {ready_case} / empty table (bare loop: {bare_rates[ready_case] / bare_empty:.2f})",
            "value": rates[ready_case] / empty,
            "goal": 0.9,
            "unit": "x",
        },
        {
            "benchmark": "backlog",
            "what": f"rate {finished_case} rows / empty table (bare loop: {bare_rates[finished_case] / bare_empty:.2f})",
            "value": rates[finished_case] / empty,
            "goal": 0.95,
            "unit": "x",
        },
    ]


if __name__ == "__main__":
    main()

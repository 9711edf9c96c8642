#!/usr/bin/env python
"""Every benchmark in one run, then one summary table against the goals of issue 13.

    bench/run_all.sh --full     # about 15 minutes on 2 cores; creates and migrates backwave_bench
    bench/run_all.sh --quick    # about 4 minutes

Each benchmark prints its own lines (every contender beside its baseline) as it goes; the table
at the end repeats the figures the goals are about. Run on an otherwise idle machine: the CPU
figures hold under load, the rates and latencies do not.

A full run takes throughput in three rounds (``throughput.py --repeat 3``), and the table holds
the median of each ratio, every ratio measured within its own round: on a shared 2-core virtual
machine, two full runs twelve minutes apart put one process at 0.59 and then 0.38 of the bare
loop, with the bare loop's own rate moving by a third between rounds. One round shows which
way a change goes; three are what a figure in a note should rest on. The backlog's three cases
run in three rounds too (``backlog.py --repeat 3``, about 4 minutes): in two full runs of one
session a single round put the case beside a million finished rows at 0.91 and then 1.01 of the
empty table, either side of its goal, with the bare loop's own ratio at 0.97 and 1.01.
"""

from __future__ import annotations

import argparse
import sys

import backlog
import latency
import orm_jobs
import sleepers
import throughput
from common import require_bench_database, uptime_line

# Rounds of throughput.py and of backlog.py in a full run (see above).
THROUGHPUT_ROUNDS = 3
BACKLOG_ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--full", action="store_true", help="the sizes of the issue (the default)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["throughput", "latency", "sleepers", "orm", "backlog"])
    args = parser.parse_args()
    require_bench_database()
    quick = ["--quick"] if args.quick else []
    print(f"BackWave benchmarks ({'quick' if args.quick else 'full'}); {uptime_line()}\n")
    summary = []
    for name, module, extra in (
        ("throughput", throughput, [] if args.quick else ["--repeat", str(THROUGHPUT_ROUNDS)]),
        ("latency", latency, []),
        ("sleepers", sleepers, ["--linger-ms", "10", "0", "2", "1000"]),
        ("orm", orm_jobs, []),
        ("backlog", backlog, [] if args.quick else ["--repeat", str(BACKLOG_ROUNDS)]),
    ):
        if name in args.skip:
            continue
        summary += module.main(quick + extra)
        print()
    print(f"Summary; {uptime_line()}")
    print(f"{'benchmark':<11} {'figure':<112} {'value':>8} {'goal':>8}  met")
    for row in summary:
        value, goal, unit = row["value"], row["goal"], row["unit"]
        shown = (lambda v: f"{v:.0%}") if unit == "%" else (lambda v: f"{v:.2f}" if isinstance(v, float) else f"{v}")
        if goal is None:
            met = ""
        elif row.get("below"):
            met = "yes" if value <= goal else "NO"
        else:
            met = "yes" if value >= goal else "NO"
        goal_text = "-" if goal is None else ("<= " if row.get("below") else ">= ") + shown(goal)
        print(f"{row['benchmark']:<11} {row['what']:<112} {shown(value):>8} {goal_text:>8}  {met}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The simulator's command line.

    python -m backwave.testing.simulation --seed 1234 --log     # one seed, its full event log
    python -m backwave.testing.simulation --seeds 20000 --workers 2
    python -m backwave.testing.simulation --seeds 500 --ambiguous-faults
    python -m backwave.testing.simulation --seeds 2000 --no-thread-checks --no-hostile-values  # hunt the rest

Every Config field is a flag (a knob that is on by default has its --no- form). Exits 1 when a
seed fails, after printing each failure with the command that replays it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from dataclasses import fields

from . import Config, SimulationFailure, run_seed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m backwave.testing.simulation", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run this one seed")
    which.add_argument("--seeds", type=int, help="run this many seeds, from --start on")
    parser.add_argument("--start", type=int, default=0, help="the first seed of --seeds (default 0)")
    parser.add_argument("--workers", type=int, default=1, help="processes for --seeds (default 1)")
    parser.add_argument("--log", action="store_true", help="with --seed: print the full event log")
    parser.add_argument("--show", type=int, default=5, help="failures printed in full with --seeds (default 5)")
    default = Config()
    for f in fields(Config):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(default, f.name)
        if isinstance(value, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, dest=f.name, type=type(value), default=value, help=f"(default {value})")
    return parser


def _one(job: tuple[int, Config]) -> tuple[int, int, str | None]:
    seed, config = job
    try:
        result = run_seed(seed, config)
    except SimulationFailure as failure:
        return seed, 0, str(failure)
    return seed, result.steps, None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = Config(**{f.name: getattr(args, f.name) for f in fields(Config)})
    if args.seed is not None:
        try:
            result = run_seed(args.seed, config, keep_log=args.log)
        except SimulationFailure as failure:
            if args.log:
                print("\n".join(failure.lines or ()))
            print(failure)
            return 1
        if args.log:
            print("\n".join(result.lines or ()))
        print(
            f"seed {args.seed}: ok, {result.jobs} jobs, {result.steps} steps, {result.virtual_seconds:.1f} virtual seconds, log {result.digest}"
        )
        return 0
    seeds = range(args.start, args.start + args.seeds)
    failures: list[str] = []
    steps, done = 0, 0
    started = last = time.perf_counter()
    jobs = ((seed, config) for seed in seeds)
    with multiprocessing.Pool(args.workers) if args.workers > 1 else _Serial() as pool:
        for seed, seed_steps, failure in pool.imap_unordered(_one, jobs, chunksize=16):
            done += 1
            steps += seed_steps
            if failure is not None:
                failures.append(failure)
                if len(failures) <= args.show:
                    print(failure, "\n", flush=True)
            now = time.perf_counter()
            if now - last >= 10:
                last = now
                print(f"... {done}/{len(seeds)} seeds, {len(failures)} failed, {done / (now - started):.1f} seeds/s", flush=True)
    elapsed = time.perf_counter() - started
    print(
        f"{len(seeds)} seeds ({seeds.start}..{seeds.stop - 1}) in {elapsed:.1f} s: {len(seeds) / elapsed:.1f} seeds/s, "
        f"{steps / elapsed:,.0f} steps/s, {args.workers} worker(s); {len(failures)} failed"
    )
    for failure in failures:
        print("  " + failure.rsplit("replay: ", 1)[-1] + "   # " + failure.split("\n", 1)[0])
    return 1 if failures else 0


class _Serial:
    """A stand-in for a process pool of one: the seeds run in this process."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def imap_unordered(self, function, items, chunksize=1):
        return map(function, items)


if __name__ == "__main__":
    sys.exit(main())

"""The simulator: many nodes and pumps, each with the real Node Driver, on one in-memory store,
with one seeded random source deciding every interleaving and every fault.

    from backwave.testing.simulation import Config, run_seed
    result = run_seed(1234)                 # raises SimulationFailure with the replay command

    python -m backwave.testing.simulation --seeds 1000      # many seeds
    python -m backwave.testing.simulation --seed 1234 --log # one seed, its full event log

It needs no Django and no database. See ``world.py`` for how a run unfolds and
``invariants.py`` for what is checked after every step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .invariants import SimulationBug
from .logbook import Logbook
from .scenario import CLASSIC, Config, Scenario
from .world import World

__all__ = ["CLASSIC", "Config", "Result", "Scenario", "SimulationFailure", "replay_command", "run_seed"]


class SimulationFailure(AssertionError):
    """A seed broke an invariant. The message ends with the command that replays it."""

    def __init__(self, seed: int, config: Config, problem: str, tail: list[str], lines: list[str] | None = None):
        self.seed = seed
        self.config = config
        self.problem = problem
        self.tail = tail
        self.lines = lines  # the full event log up to the failure, when it was kept
        shown = "\n".join(f"    {line}" for line in tail)
        super().__init__(f"seed {seed}: {problem}\n  last events:\n{shown}\n  replay: {replay_command(seed, config)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """What a passing seed did."""

    seed: int
    digest: str  # of the full event log: two runs of a seed give the same one
    lines: tuple[str, ...] | None  # the full log, when asked for
    steps: int
    jobs: int
    virtual_seconds: float


def replay_command(seed: int, config: Config = Config()) -> str:
    """The one command that runs ``seed`` again, with its log."""
    flags = config.flags()
    return f"python -m backwave.testing.simulation --seed {seed}{' ' + flags if flags else ''} --log"


def run_seed(seed: int, config: Config = Config(), *, keep_log: bool = False) -> Result:
    """Run one seed to the end of its quiesce; raise SimulationFailure if an invariant breaks."""
    rng = random.Random(seed)
    scenario = Scenario.draw(seed, config, rng)
    logbook = Logbook(keep=keep_log)
    world = World(scenario, config, rng, logbook)
    try:
        world.run()
    except SimulationBug as bug:
        raise SimulationFailure(seed, config, str(bug), list(logbook.tail), logbook.lines) from bug
    return Result(
        seed=seed,
        digest=logbook.digest,
        lines=tuple(logbook.lines) if logbook.lines is not None else None,
        steps=world.steps,
        jobs=len(world.invariants.enqueued),
        virtual_seconds=world.t,
    )

"""The simulated tasks: what one attempt's handler does, and the report the pump keeps of it.

``TASK`` succeeds or raises, ``UNKNOWN_TASK`` has no handler (unroutable), ``CRASH_TASK`` kills its
worker process on every attempt. With ``Config.hostile_values`` a handler also hands back what
PostgreSQL cannot store, as a real task can: NaN and the infinities, strings with a NUL character
or a lone surrogate (a file name decoded with ``surrogateescape``), integers past Python's
4,300-digit ``str()`` limit, and error messages with NULs and lone surrogates in tracebacks of up
to 200,000 characters. Each goes to the outcome write as the handler made it, the traceback cut
to ``MAX_TRACEBACK_CHARS`` as the shell cuts it: the attempt's own checks in front of the store
(``encode_result``, ``clean_text`` in backwave/shell/execution.py) are not run, so what the
simulator tests is the store's wall behind them, which must hold on its own.

Every draw comes from the seed's random source; with the knob off nothing extra is drawn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from backwave.store.storable import cut_tail

from .scenario import CRASH_TASK, TASK

# BACKWAVE["MAX_TRACEBACK_CHARS"]'s default, applied as backwave/shell/execution.py applies it.
MAX_TRACEBACK_CHARS = 16_000

BENIGN_VALUES: tuple[Any, ...] = (None, 7, "done", {"ok": True, "n": [1, 2.5]}, "emoji \U0001f600 (a surrogate pair in JSON)")
HOSTILE_VALUES: tuple[Any, ...] = (
    float("nan"),
    float("inf"),
    float("-inf"),
    [1, float("nan")],
    "NUL \x00 inside",
    {"name": "a\x00b"},
    "lone high surrogate \ud800",
    "lone low surrogate \udcff",
    {"path": "/tmp/caf\udce9"},
    ["\udc80"],
    10**4400,  # str() refuses it: more than 4,300 digits
)
HOSTILE_MESSAGES = ("cannot open /srv/caf\udce9.txt", "NUL \x00 in the message", "lone \ud83d half of an emoji")


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What one attempt produced, as backwave.shell.execution.AttemptReport carries it."""

    job_id: int
    attempt: int
    result: str  # succeeded, failed, unroutable; crash: the handler killed its process
    return_value: Any = None
    error_class: str = ""
    traceback: str = ""
    duration: float = 0.0
    # A JobContext's side channels: the simulated tasks record none.
    output: dict[str, Any] | None = None
    tags_added: tuple[str, ...] = ()
    tags_removed: tuple[str, ...] = ()


def run_handler(
    rng: random.Random, *, job_id: int, attempt: int, task_path: str, result: str, duration: float, hostile_rate: float | None
) -> Report:
    """The report of one attempt whose result and duration are already drawn (``hostile_rate``
    None: the hostile_values knob is off, nothing more is drawn)."""
    if task_path == CRASH_TASK:
        return Report(job_id=job_id, attempt=attempt, result="crash", duration=duration)
    if task_path != TASK:
        return Report(
            job_id=job_id,
            attempt=attempt,
            result="unroutable",
            error_class="backwave.shell.execution.Unroutable",
            traceback=f"no task named {task_path!r} is registered in this worker",
            duration=duration,
        )
    hostile = hostile_rate is not None and rng.random() < hostile_rate
    if result == "succeeded":
        value = None if hostile_rate is None else rng.choice(HOSTILE_VALUES if hostile else BENIGN_VALUES)
        return Report(job_id=job_id, attempt=attempt, result=result, return_value=value, duration=duration)
    message = f"attempt {attempt} failed"
    if hostile:
        message = rng.choice(HOSTILE_MESSAGES)
        if rng.random() < 0.5:  # a huge traceback, the hostile part anywhere in it
            filler = '  File "sim/tasks.py", line 1, in work\n' * (rng.randint(20_000, 200_000) // 40)
            cut = rng.randrange(len(filler) + 1)
            message = filler[:cut] + message + filler[cut:]
    text = cut_tail(
        f'Traceback (most recent call last):\n  File "sim/tasks.py", line 1, in work\nsim.tasks.Boom: {message}\n',
        MAX_TRACEBACK_CHARS,
    )
    return Report(job_id=job_id, attempt=attempt, result=result, error_class="sim.tasks.Boom", traceback=text, duration=duration)

"""``backwave_worker --processes N``: N worker processes under one supervisor.

One Python process runs one handler at a time per core at best (the GIL), so CPU-heavy tasks need
processes. The supervisor starts N children, each a plain ``backwave_worker`` with the same
arguments (its own pumps, leases and connections; they coordinate only through the database),
restarts a child that dies with exponential backoff (its jobs come back through its lease), and
forwards signals: the first SIGTERM or SIGINT makes every child drain, a second stops them at once.

With ``listener`` (the health endpoint of a single child, ``--hard-time-limits --health-port``),
the supervisor holds the bound socket and each child it starts inherits it and serves on it
(``backwave/shell/health.py``): the port outlives every replacement.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from .health import LISTENER_FD_ENV

logger = logging.getLogger("backwave.supervisor")

# A child that lived this long before dying is considered healthy again: its restart backoff resets.
STABLE_AFTER = 60.0

# The exit code of a child that ended itself because a handler ran past its hard time limit
# (backwave_worker --hard-time-limits): replaced at once, its restart backoff left as it was,
# since the process was healthy and only that handler could not be stopped.
REPLACE_ME = 75
# Set in each child's environment: what lets it end itself for a supervisor to replace.
SUPERVISED_ENV = "BACKWAVE_SUPERVISED"


def _drain_when_orphaned() -> None:
    """In the child, before exec: on Linux, ask for SIGTERM when the supervisor dies, so a
    SIGKILLed supervisor leaves no worker behind (the child drains as on any SIGTERM)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


class Child:
    def __init__(self, index: int):
        self.index = index
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.restart_at = 0.0
        self.backoff = 0.0
        self.restarts = 0
        self.done = False


class Supervisor:
    """Keeps ``processes`` copies of ``command`` running until told to stop."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        initial_backoff: float = 0.5,
        max_backoff: float = 30.0,
        tick: float = 0.2,
        listener: socket.socket | None = None,
    ):
        if processes < 1:
            raise ValueError(f"--processes must be at least 1, got {processes}")
        if listener is not None and processes != 1:
            raise ValueError(f"one health endpoint serves one worker process, not {processes}")
        self.listener = listener
        self.command = list(command)
        self.children = [Child(i) for i in range(processes)]
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._tick = tick
        self._signals = 0

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for child in self.children:
            self._start(child)
        logger.info("Supervisor started %d worker processes", len(self.children))
        while True:
            now = time.monotonic()
            for child in self.children:
                self._watch(child, now)
            finished = all(c.process is None or c.process.poll() is not None for c in self.children)
            if finished and (self._signals or all(c.done for c in self.children)):
                break
            time.sleep(self._tick)
        if self.listener is not None:
            self.listener.close()
        codes = [c.process.returncode for c in self.children if c.process is not None]
        logger.info("Supervisor stopped; worker exit codes %s", codes)
        return 0 if all(code == 0 for code in codes) else 1

    def _watch(self, child: Child, now: float) -> None:
        if child.done:
            return
        if child.process is None:
            if not self._signals and now >= child.restart_at:
                self._start(child)
            return
        code = child.process.poll()
        if code is None or self._signals:
            return
        if code == 0:
            # A clean exit is a finished drain (--until-idle, or a drain the child was asked
            # for), not a crash: it is not restarted. The supervisor ends when all have.
            child.done = True
            return
        lived = now - child.started_at
        if code == REPLACE_ME:
            child.restart_at = now
            child.process = None
            logger.warning(
                "Worker process %d ended itself after %.1fs to stop a handler past its hard time limit; replacing it",
                child.index,
                lived,
            )
            return
        child.backoff = (
            self._initial_backoff if lived >= STABLE_AFTER or not child.backoff else min(child.backoff * 2, self._max_backoff)
        )
        child.restart_at = now + child.backoff
        child.process = None
        logger.warning(
            "Worker process %d exited with %s after %.1fs; restarting in %.1fs", child.index, code, lived, child.backoff
        )

    def _start(self, child: Child) -> None:
        # Its own session: a Ctrl-C in the terminal reaches only the supervisor, which forwards
        # exactly one signal, so a child never mistakes it for a second "stop at once".
        env = {**os.environ, SUPERVISED_ENV: "1"}
        pass_fds: tuple[int, ...] = ()
        if self.listener is not None:
            env[LISTENER_FD_ENV] = str(self.listener.fileno())
            pass_fds = (self.listener.fileno(),)
        child.process = subprocess.Popen(
            self.command, start_new_session=True, preexec_fn=_drain_when_orphaned, env=env, pass_fds=pass_fds
        )
        child.started_at = time.monotonic()
        child.restarts += 1
        logger.info("Worker process %d started (pid %d)", child.index, child.process.pid)

    def _on_signal(self, signum, frame) -> None:
        self._signals += 1
        action = "draining" if self._signals == 1 else "stopping at once"
        logger.info("Received %s: %s all worker processes", signal.Signals(signum).name, action)
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signum if self._signals == 1 else signal.SIGINT)

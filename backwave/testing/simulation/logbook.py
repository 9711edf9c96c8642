"""The run's event log: every event each driver took, the commands it answered with, every
statement the database ran and every fault, one line each, stamped with virtual time.

Two runs of one seed write identical logs; the digest compares them cheaply, ``lines`` (when
kept) in full, and a failure prints the tail.
"""

from __future__ import annotations

import hashlib
from collections import deque

from backwave.core import commands as cmd
from backwave.core import events as ev


class Logbook:
    """Digest (always), the last lines (always) and every line (when ``keep``)."""

    def __init__(self, *, keep: bool = False, tail: int = 80):
        self.lines: list[str] | None = [] if keep else None
        self.tail: deque[str] = deque(maxlen=tail)
        self._digest = hashlib.blake2b(digest_size=16)
        self.count = 0

    def line(self, t: float, who: str, text: str) -> None:
        entry = f"{t:.6f} {who} {text}"
        self.count += 1
        self._digest.update(entry.encode())
        self.tail.append(entry)
        if self.lines is not None:
            self.lines.append(entry)

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()


def fmt_event(event: ev.Event) -> str:
    """One event, short (job ids with their attempt numbers, lease ids cut to 8 digits)."""
    name = type(event).__name__
    match event:
        case ev.ClaimReturned():
            detail = ",".join(f"{j.id}.{j.attempt}" for j in event.jobs)
        case ev.JobFinished():
            detail = f"{event.job_id}.{event.attempt} {event.result} j={event.jitter:.3f}"
        case ev.OutcomesWritten():
            detail = ",".join(map(str, sorted(event.applied)))
        case ev.LeaseOpened():
            detail = event.lease_id.hex[:8]
        case ev.LeaseRenewed():
            detail = "held" if event.held else "LOST"
        case ev.StoreFailed():
            detail = type(event.command).__name__
        case ev.LeasesExpired() | ev.JobsPurged() | ev.PumpsPurged() | ev.TaskStatsPurged():
            detail = str(getattr(event, "released", getattr(event, "purged", "")))
        case ev.StatsRolledUp():
            detail = str(event.rolled)
        case ev.TablesAnalyzed():
            detail = ",".join(event.tables)
        case ev.JobsReleased():
            detail = ",".join(map(str, sorted(event.released)))
        case ev.DrainRequested():
            detail = f"timeout={event.timeout}"
        case _:
            detail = ""
    return f"{name}({detail})@{event.now:.4f}"


def fmt_command(command: cmd.Command) -> str:
    """One command, short."""
    match command:
        case cmd.ClaimJobs():
            return f"Claim({'/'.join(command.queues)},{command.limit})"
        case cmd.ExecuteJob():
            return f"Exec({command.job.id}.{command.job.attempt})"
        case cmd.WriteOutcomes():
            return "Write(" + ",".join(f"{o.job_id}.{o.attempt}:{o.kind.value}" for o in command.outcomes) + ")"
        case cmd.ReleaseJobs():
            return f"ReleaseJobs({','.join(map(str, command.job_ids))})"
        case cmd.ReconcileLease():
            return f"Reconcile(known {','.join(map(str, command.known))})"
    return type(command).__name__

"""When a pump runs maintenance, and what one run sends.

Every step is harmless when other nodes run it at the same time: lease expiry, schedule minting,
and retention's purge of finished jobs and silent pumps. Jobs are purged a page at a time; a full
page means more are due, purged on the next tick, so a large backlog never holds the pump (and
its heartbeat) for long.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import commands as cmd
from .ledger import Ledger
from .options import WorkerGroupOptions

# Rows one purge statement deletes at most.
PURGE_BATCH = 1000


@dataclass
class Maintenance:
    options: WorkerGroupOptions
    ledger: Ledger  # the driver's: a purge page in flight is waited for, the other steps are not
    next_run: float = 0.0
    next_purge: float | None = None  # set after a full purge page

    def next_due(self) -> float:
        return self.next_run if self.next_purge is None else min(self.next_run, self.next_purge)

    def due(self, now: float) -> list[cmd.Command]:
        """The commands due at ``now``: a whole run on its interval, else the next purge page."""
        if now >= self.next_run:
            self.next_run = now + self.options.maintenance_interval
            commands: list[cmd.Command] = [cmd.ExpireLeases(limit=cmd.EXPIRY_BATCH), cmd.MintSchedules()]
            commands += self._purge(now)
            if self.options.retention.pumps is not None:
                commands.append(cmd.PurgePumps(older_than=float(self.options.retention.pumps)))
            return commands
        if self.next_purge is not None and now >= self.next_purge:
            return self._purge(now)
        return []

    def page_purged(self, purged: int, now: float, *, running: bool) -> None:
        """A purge page landed; a full one, while running, makes the next page due at once:
        after whatever else is waiting (outcomes, the heartbeat), not in a loop."""
        self.ledger.landed(cmd.PurgeJobs)
        if purged == PURGE_BATCH and running:
            self.next_purge = now

    def purge_failed(self) -> None:
        # The next run starts over; nothing was deleted.
        self.ledger.failed(cmd.PurgeJobs)
        self.next_purge = None

    def _purge(self, now: float) -> list[cmd.Command]:
        self.next_purge = None
        if self.ledger.busy(cmd.PurgeJobs) or not self.options.retention.job_states:
            return []
        return [self.ledger.send(cmd.PurgeJobs(retention=self.options.retention, limit=PURGE_BATCH), now)]

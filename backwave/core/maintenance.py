"""When a pump runs maintenance, and what one run sends.

Every step is harmless when other nodes run it at the same time: lease expiry, schedule minting,
the rollup of finished attempts into per-task statistics, retention's purge of finished jobs,
silent pumps and old statistics buckets, and the refresh of the planner's statistics of tables autovacuum left behind. The rollup and the purge work a page at a time; a full page means more is due,
done on the next tick, so a large backlog never holds the pump (and its heartbeat) for long. The
rollup goes before the purge: the purge keeps a job until its attempts are rolled up.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import commands as cmd
from .ledger import Ledger
from .options import WorkerGroupOptions

# Rows one purge statement deletes at most.
PURGE_BATCH = 1000
# Attempts one rollup statement folds into the statistics at most.
ROLLUP_BATCH = 5000


@dataclass
class Maintenance:
    options: WorkerGroupOptions
    ledger: Ledger  # the driver's: a purge page in flight is waited for, the other steps are not
    next_run: float = 0.0
    next_purge: float | None = None  # set after a full purge page
    next_rollup: float | None = None  # set after a full rollup page

    def next_due(self) -> float:
        return min(moment for moment in (self.next_run, self.next_purge, self.next_rollup) if moment is not None)

    def due(self, now: float) -> list[cmd.Command]:
        """The commands due at ``now``: a whole run on its interval, else the next purge page."""
        if now >= self.next_run:
            self.next_run = now + self.options.maintenance_interval
            commands: list[cmd.Command] = [cmd.ExpireLeases(limit=cmd.EXPIRY_BATCH), cmd.MintSchedules()]
            commands += self._roll_up(now)
            commands.append(cmd.AnalyzeTables())
            commands += self._purge(now)
            if self.options.retention.pumps is not None:
                commands.append(cmd.PurgePumps(older_than=float(self.options.retention.pumps)))
            if self.options.retention.task_stats:
                commands.append(cmd.PurgeTaskStats(older_than=self.options.retention.task_stats))
            return commands
        commands = []
        if self.next_rollup is not None and now >= self.next_rollup:
            commands += self._roll_up(now)
        if self.next_purge is not None and now >= self.next_purge:
            commands += self._purge(now)
        return commands

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

    def page_rolled_up(self, rolled: int, now: float, *, running: bool) -> None:
        """A rollup page landed; a full one, while running, makes the next page due at once."""
        self.ledger.landed(cmd.RollUpStats)
        if rolled == ROLLUP_BATCH and running:
            self.next_rollup = now

    def rollup_failed(self) -> None:
        # The watermark did not move: the next run starts where this one would have.
        self.ledger.failed(cmd.RollUpStats)
        self.next_rollup = None

    def _roll_up(self, now: float) -> list[cmd.Command]:
        self.next_rollup = None
        if self.ledger.busy(cmd.RollUpStats):
            return []
        return [self.ledger.send(cmd.RollUpStats(limit=ROLLUP_BATCH), now)]

    def _purge(self, now: float) -> list[cmd.Command]:
        self.next_purge = None
        if self.ledger.busy(cmd.PurgeJobs) or not self.options.retention.job_states:
            return []
        return [self.ledger.send(cmd.PurgeJobs(retention=self.options.retention, limit=PURGE_BATCH), now)]

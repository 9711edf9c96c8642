"""How a pump drains: it claims no more and gives back the jobs a claim in flight still brings;
it writes what is buffered once nothing executes (or its deadline passes), then gives the lease
back. A failed release, or a store fault past the deadline, ends it: the lease lapses and
maintenance anywhere frees the rest (the driver's StoreFailed handler).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from . import commands as cmd
from .jobs import ClaimedJob
from .ledger import Ledger
from .slots import Slots


@dataclass
class Drain:
    ledger: Ledger  # the driver's: the ReleaseLease is sent through it
    slots: Slots  # the driver's: what still executes, and the outcomes to write
    deadline: float | None = None  # set when the drain starts

    def past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def step(self, now: float, lease_id: uuid.UUID | None, *, claiming: bool, trusted: bool) -> list[cmd.Command]:
        """Move the drain forward: write what is buffered, then give the lease back. Nothing
        while a claim, a write or the release is in flight; no write under a lease not trusted."""
        outcomes = self.slots.outcomes
        if claiming or outcomes.writing or self.ledger.busy(cmd.ReleaseLease):
            return []
        if self.slots.executing and not self.past_deadline(now):
            if not outcomes.full:
                return []
        elif not outcomes.waiting:
            return self.release(now, lease_id)
        elif not outcomes.writable(now):
            # Only busy outcomes wait (another transaction holds their rows): written again once
            # due, until the deadline; past it they go with the lease.
            return self.release(now, lease_id) if self.past_deadline(now) else []
        return outcomes.write(now, lease_id) if trusted else []

    def release(self, now: float, lease_id: uuid.UUID | None) -> list[cmd.Command]:
        return [self.ledger.send(cmd.ReleaseLease(lease_id=lease_id), now)]

    def give_back(self, jobs: tuple[ClaimedJob, ...], lease_id: uuid.UUID | None) -> list[cmd.Command]:
        """ReleaseJobs of jobs the pump will not start: those of a claim that was in flight when
        the drain started, or those claimed ahead (at a drain, or behind a handler past its
        deadline)."""
        ids = tuple(job.id for job in jobs)
        return [cmd.ReleaseJobs(lease_id=lease_id, job_ids=ids)] if ids else []

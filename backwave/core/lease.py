"""The lease's clocks for the Node Driver: when to try opening one again, when to heartbeat, and
until when the lease may be written under.

Self-fencing: the lease is trusted until 90% of ``lease_duration`` after the last renewal that
landed was sent. Past that the driver sends no claim and no outcome write under it; the next
Tick (due at once) abandons its jobs, drops the buffered outcomes and opens a new lease.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from . import commands as cmd
from .ledger import Ledger
from .options import SELF_FENCE_MARGIN, WorkerGroupOptions


@dataclass
class LeaseClock:
    options: WorkerGroupOptions
    ledger: Ledger  # the driver's: every OpenLease and RenewLease is sent through it
    trusted_until: float = 0.0
    next_heartbeat: float = 0.0
    next_open: float = 0.0  # after a failed OpenLease: when to try again

    def open(self, now: float) -> list[cmd.Command]:
        return [self.ledger.send(cmd.OpenLease(), now)]

    def reopen_due(self, now: float) -> bool:
        return not self.ledger.busy(cmd.OpenLease) and now >= self.next_open

    def opened(self, now: float) -> float:
        """The OpenLease in flight landed: heartbeat from now on. Returns when it was sent."""
        _, sent_at = self.ledger.landed(cmd.OpenLease)
        self.next_heartbeat = now + self.options.heartbeat_every
        return sent_at

    def open_failed(self, retry_at: float) -> None:
        self.ledger.failed(cmd.OpenLease)
        self.next_open = retry_at

    def heartbeat(self, now: float, lease_id: uuid.UUID | None) -> list[cmd.Command]:
        """The RenewLease due at ``now``, if one is due and none is in flight."""
        if now < self.next_heartbeat or self.ledger.busy(cmd.RenewLease) or lease_id is None:
            return []
        self.next_heartbeat = now + self.options.heartbeat_every
        return [self.ledger.send(cmd.RenewLease(lease_id=lease_id), now)]

    def renewed(self) -> float:
        """The RenewLease in flight landed. Returns when it was sent."""
        _, sent_at = self.ledger.landed(cmd.RenewLease)
        return sent_at

    def renew_failed(self, retry_at: float) -> None:
        self.ledger.failed(cmd.RenewLease)
        self.next_heartbeat = min(self.next_heartbeat, retry_at)

    def trust_from(self, sent_at: float) -> None:
        # The database stamped the renewal no earlier than we sent it, so the lease is ours at
        # least until sent_at + lease_duration; stop a margin before that.
        self.trusted_until = sent_at + self.options.lease_duration * (1.0 - SELF_FENCE_MARGIN)

    def trusted(self, now: float) -> bool:
        """Whether the lease may still be written under (see self-fencing above)."""
        return now < self.trusted_until

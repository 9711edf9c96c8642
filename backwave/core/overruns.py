"""Overruns: handlers that outlive the attempt the driver ended without them.

Past its deadline (a time limit, a cancel's grace) an attempt ends at once: its outcome is
buffered and the job will be ready again (or finished) when the write lands, while its handler's
thread goes on. Until that handler returns it must still count against its queue's concurrency
limit and its key's per-key limit, cluster-wide, so the store has to know of it: the outcome
goes out flagged ``overrun`` (the write leaves an overrun row under the lease in the statement
that ends the attempt), and once the handler returns a ``ForgetOverruns`` deletes that row.

The flag is set when a batch is written, not when the outcome is decided: a handler that
returned while its outcome still waited leaves no row at all, and a write that failed is sent
again flagged as things are then. A row may exist for every attempt that went out flagged (a
write whose answer was lost may have committed), so each of those is forgotten once its handler
returns, behind the writes already sent (commands run in order on the pump's one connection).
A lost lease, a self-fence or a drain's end drops all of it: the rows count only under a live
lease, and go with it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from . import commands as cmd
from .jobs import Outcome
from .ledger import Ledger

Attempt = tuple[int, int]  # (job id, attempt)


@dataclass
class Overruns:
    ledger: Ledger  # the driver's: every ForgetOverruns is sent through it
    running: set[Attempt] = field(default_factory=set)  # ended past their deadline, handler still running
    written: set[Attempt] = field(default_factory=set)  # went out flagged: a row may exist
    returned: set[Attempt] = field(default_factory=set)  # handler returned, its row (if any) still to forget
    not_before: float = 0.0  # a failed ForgetOverruns is sent again no sooner (its fault backoff)

    def ended_without_handler(self, job_id: int, attempt: int) -> None:
        self.running.add((job_id, attempt))

    def flag(self, batch: tuple[Outcome, ...]) -> tuple[Outcome, ...]:
        """The batch as it is written now: each outcome flagged overrun while its handler runs."""
        if not self.running and not any(outcome.overrun for outcome in batch):
            return batch
        flagged = []
        for outcome in batch:
            key = (outcome.job_id, outcome.attempt)
            overrun = key in self.running
            if overrun:
                self.written.add(key)
            flagged.append(outcome if outcome.overrun == overrun else replace(outcome, overrun=overrun))
        return tuple(flagged)

    def handler_returned(self, job_id: int, attempt: int) -> None:
        key = (job_id, attempt)
        self.running.discard(key)
        if key in self.written:
            self.written.discard(key)
            self.returned.add(key)

    def send(self, now: float, lease_id: uuid.UUID | None) -> list[cmd.Command]:
        """The ForgetOverruns of the handlers that returned; none while one is in flight."""
        if not self.returned or lease_id is None or self.ledger.busy(cmd.ForgetOverruns) or now < self.not_before:
            return []
        attempts = tuple(sorted(self.returned))
        self.returned.clear()
        return [self.ledger.send(cmd.ForgetOverruns(lease_id=lease_id, attempts=attempts), now)]

    def next_due(self) -> float | None:
        """When a ForgetOverruns that failed is due again (None: nothing waits for one)."""
        if not self.returned or self.ledger.busy(cmd.ForgetOverruns):
            return None
        return self.not_before

    def forgotten(self) -> None:
        self.ledger.landed(cmd.ForgetOverruns)

    def forget_failed(self, retry_at: float) -> None:
        failed, _ = self.ledger.failed(cmd.ForgetOverruns)
        self.returned.update(failed.attempts)
        self.not_before = retry_at

    def lease_lost(self) -> None:
        """The lease is given up: its overruns count no more, and go with it."""
        self.running.clear()
        self.written.clear()
        self.returned.clear()

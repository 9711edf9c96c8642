"""Claim planning for the Node Driver: one dispatch pass across the claims it sends, and the
checks a claim's answer must pass before the driver takes its jobs.

A pass is the set of claims the policy plans for the free slots at one moment (one claim for
Strict, one per queue for Weighted). What the pass learns (a queue came back short, a claim came
back full, a hint came while it was in flight) decides, when its last claim lands, whether to
claim again at once and which queues to leave out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import commands as cmd
from .jobs import ClaimedJob
from .ledger import Ledger
from .options import WorkerGroupOptions


@dataclass
class Claims:
    options: WorkerGroupOptions
    ledger: Ledger  # the driver's: every claim and reconcile is sent through it
    next_poll: float = 0.0
    # A claim failed without an answer: it may have committed jobs this pump never heard of,
    # still running under its lease. Before the next claim, give back whatever runs under the
    # lease that the driver does not know (ReconcileLease).
    reconcile_needed: bool = False
    policy_state: dict[str, int] = field(default_factory=dict)  # the policy's round-robin memory
    skip: set[str] = field(default_factory=set)  # queues whose claim came back short this pass
    full: bool = False  # some claim of this pass came back full: more is waiting
    hinted: bool = False  # a hint came while a claim of this pass was in flight
    last_short: bool = False  # the last claim found fewer jobs than it asked for

    @property
    def limit_in_flight(self) -> int:
        """Jobs asked for by the claims in flight (their slots are reserved until they return)."""
        # Asked once or more for every finished job: the ledger's queue read directly, and
        # nothing summed when no claim is in flight.
        sent = self.ledger.sent(cmd.ClaimJobs)
        return sum(claim.limit for claim, _ in sent) if sent else 0

    def send(
        self, now: float, limit: int, lease_id, held: Callable[[], set], skip: frozenset[str] = frozenset()
    ) -> list[cmd.Command]:
        """One pass of the dispatch policy for ``limit`` slots, or the reconcile it must wait for."""
        if self.reconcile_needed:
            # No claim until the lease is reconciled: one that ran before it could add to jobs
            # the pump does not know, and one that ran despite a failed reconcile would too.
            # LeaseReconciled claims again.
            self.next_poll = now + self.options.poll_interval
            if self.ledger.busy(cmd.ReconcileLease):
                return []
            return [self.ledger.send(cmd.ReconcileLease(lease_id=lease_id, known=tuple(sorted(held()))), now)]
        planned = self.options.policy.plan(limit, self.policy_state, skip)
        if planned:
            self.next_poll = now + self.options.poll_interval
        return [self.ledger.send(cmd.ClaimJobs(lease_id=lease_id, queues=queues, limit=n), now) for queues, n in planned]

    def hinted_at(self, now: float, free: int) -> bool:
        """A hint came: whether to poll now. A pass in flight claims again once it lands, room
        permitting (one pending-poll slot: a burst costs one extra claim). With no ``free`` slot
        there is nothing to claim with: a slot that reopens through a write claims anyway, and
        polling now would only flush a half-full buffer early."""
        if self.limit_in_flight:
            self.hinted = True
            return False
        if not free:
            return False
        self.next_poll = min(self.next_poll, now)
        return True

    def landed(self, got: int) -> cmd.ClaimJobs:
        """The oldest claim in flight returned ``got`` jobs; returns that claim."""
        asked, _ = self.ledger.landed(cmd.ClaimJobs)
        if got < asked.limit:
            self.skip.update(asked.queues)
        else:
            self.full = True
        self.last_short = got < asked.limit
        return asked

    def end(self) -> frozenset[str] | None:
        """The pass's last claim landed: the queues to leave out of a claim sent at once, or None
        when nothing says more is waiting. A full batch says more is waiting; a hint said the same
        while the pass was busy, about any queue, so it leaves none out."""
        more_waiting = self.hinted or self.full
        skip = frozenset() if self.hinted else frozenset(self.skip)
        self.forget()
        return skip if more_waiting else None

    def failed(self, retry_at: float) -> None:
        self.reconcile_needed = True
        self.ledger.failed(cmd.ClaimJobs)
        self.hinted = False
        if not self.limit_in_flight:
            self.forget()
        self.retry_no_sooner_than(retry_at)

    def reconciled(self) -> None:
        self.ledger.landed(cmd.ReconcileLease)
        self.reconcile_needed = False

    def reconcile_failed(self, retry_at: float) -> None:
        self.ledger.failed(cmd.ReconcileLease)  # still needed: tried again before the next claim
        self.retry_no_sooner_than(retry_at)

    def retry_no_sooner_than(self, retry_at: float) -> None:
        self.next_poll = max(self.next_poll, retry_at)

    def lease_lost(self) -> None:
        """The claims in flight are the ledger's stale results now; whatever a lost claim left
        under the old lease lapses with it."""
        if self.limit_in_flight:
            self.forget()
        self.reconcile_needed = False

    def forget(self) -> None:
        """The pass is over without an answer (its claims failed, or the lease was lost)."""
        self.skip.clear()
        self.full = False
        self.hinted = False


def refusal(
    jobs: tuple[ClaimedJob, ...],
    asked: int,
    executing: dict,
    *,
    queued: set[int],
    unreported: int,
    obsolete: int,
    abandoned: int,
    pool_size: int,
    ahead: int,
    busy: int = 0,
) -> str | None:
    """Why a claim's answer cannot be taken, or None. ``obsolete`` buffered outcomes are of jobs
    the claim returned again: they give their slots to the new attempts. ``ahead``: the most jobs
    that may wait for a thread beyond the pool's ``pool_size``. ``busy`` buffered outcomes came
    back busy from a write: a claim riding that write was sized as if they had landed, so its
    answer may hold that many more (the pump claims nothing more until they land)."""
    if len(jobs) > asked:
        return f"the claim asked for {asked} jobs and got {len(jobs)}"
    ids = [job.id for job in jobs]
    if len(set(ids)) != len(ids) or any(i in executing or i in queued for i in ids):
        return f"the claim returned a job this pump already holds: {ids}"
    if unreported - obsolete - busy + abandoned + len(jobs) > pool_size + ahead:
        held = f"{unreported} unreported" + (f" + {abandoned} abandoned" if abandoned else "")
        room = f"pool_size {pool_size}" + (f" + {ahead} ahead" if ahead else "")
        return f"backpressure violated: {held} + {len(jobs)} claimed > {room}"
    return None

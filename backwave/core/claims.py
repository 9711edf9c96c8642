"""Claim planning for the Node Driver: one dispatch pass across the claims it sends, and the
checks a claim's answer must pass before the driver takes its jobs.

A pass is the set of claims the policy plans for the free slots at one moment (one claim for
Strict, one per queue for Weighted). What the pass learns (a queue came back short, a claim came
back full, a hint came while it was in flight) decides, when its last claim lands, whether to
claim again at once and which queues to leave out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobs import ClaimedJob
from .policy import Claim, DispatchPolicy


@dataclass
class ClaimPass:
    policy_state: dict[str, int] = field(default_factory=dict)  # the policy's round-robin memory
    skip: set[str] = field(default_factory=set)  # queues whose claim came back short this pass
    full: bool = False  # some claim of this pass came back full: more is waiting
    hinted: bool = False  # a hint came while a claim of this pass was in flight
    last_short: bool = False  # the last claim found fewer jobs than it asked for

    def plan(self, policy: DispatchPolicy, limit: int, skip: frozenset[str]) -> list[Claim]:
        return policy.plan(limit, self.policy_state, skip)

    def landed(self, queues: tuple[str, ...], asked: int, got: int) -> None:
        if got < asked:
            self.skip.update(queues)
        else:
            self.full = True
        self.last_short = got < asked

    def end(self) -> frozenset[str] | None:
        """The pass's last claim landed: the queues to leave out of a claim sent at once, or None
        when nothing says more is waiting. A full batch says more is waiting; a hint said the same
        while the pass was busy, about any queue, so it leaves none out."""
        more_waiting = self.hinted or self.full
        skip = frozenset() if self.hinted else frozenset(self.skip)
        self.forget()
        return skip if more_waiting else None

    def forget(self) -> None:
        """The pass is over without an answer (its claims failed, or the lease was lost)."""
        self.skip.clear()
        self.full = False
        self.hinted = False


def refusal(jobs: tuple[ClaimedJob, ...], asked: int, executing: dict, *, unreported: int, obsolete: int, abandoned: int, pool_size: int) -> str | None:
    """Why a claim's answer cannot be taken, or None. ``obsolete`` buffered outcomes are of jobs
    the claim returned again: they give their slots to the new attempts."""
    if len(jobs) > asked:
        return f"the claim asked for {asked} jobs and got {len(jobs)}"
    ids = [job.id for job in jobs]
    if len(set(ids)) != len(ids) or any(i in executing for i in ids):
        return f"the claim returned a job this pump already holds: {ids}"
    if unreported - obsolete + abandoned + len(jobs) > pool_size:
        held = f"{unreported} unreported" + (f" + {abandoned} abandoned" if abandoned else "")
        return f"backpressure violated: {held} + {len(jobs)} claimed > pool_size {pool_size}"
    return None

"""What a Node Driver counts: the shell logs these and the tests pin them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class DriverStats:
    claims: int = 0
    claimed: int = 0
    writes: int = 0
    applied: int = 0
    lost: int = 0  # outcomes the fence refused: the lease was no longer ours
    abandoned: int = 0  # jobs given up on because the lease was lost
    heartbeats: int = 0
    store_faults: int = 0
    minted: int = 0  # jobs minted from schedules by this pump's maintenance
    purged: int = 0  # finished jobs purged by this pump's maintenance
    rolled_up: int = 0  # finished attempts folded into the task statistics by this pump's maintenance
    reconciled: int = 0  # jobs a lost claim reply had left under the lease, given back
    released: int = 0  # dependents this pump's outcome writes made ready
    busy: int = 0  # outcomes a write came back with because another transaction held their row
    released_again: int = 0  # ReleaseJobs sent again of jobs a release passed over (rows held)

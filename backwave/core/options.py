"""Worker group options and their validation (the seeds' two messages, word for word)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from .policy import DispatchPolicy, Strict


class WorkerGroupConfigError(ValueError):
    """A worker group is configured in a way BackWave cannot run."""


DAY = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """How long maintenance keeps finished jobs (per final state) and the health rows of pumps
    that stopped reporting, in seconds since they finished or last reported; None keeps them.

    Cluster-wide: every maintenance run purges by the same rules (``BACKWAVE["RETENTION"]``).
    A job's attempts go with it.
    """

    succeeded: float | None = DAY
    failed: float | None = 7 * DAY
    cancelled: float | None = 7 * DAY
    quarantined: float | None = 7 * DAY
    pumps: float | None = 3_600.0  # a pump silent this long (killed, host gone) is forgotten

    def __post_init__(self):
        for name in ("succeeded", "failed", "cancelled", "quarantined", "pumps"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise WorkerGroupConfigError(f"Retention {name} must be a number of seconds >= 0 or None (keep for ever), got {value!r}.")

    @property
    def job_states(self) -> tuple[tuple[str, float], ...]:
        """(state, seconds) for every finished state that is purged at all, in a fixed order."""
        pairs = (("succeeded", self.succeeded), ("failed", self.failed), ("cancelled", self.cancelled), ("quarantined", self.quarantined))
        return tuple((state, float(seconds)) for state, seconds in pairs if seconds is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerGroupOptions:
    """One worker group: its queues (through the policy) and every throughput dial.

    A group's peak concurrency on a node is ``pumps * pool_size``. Intervals are seconds.
    """

    name: str
    policy: DispatchPolicy = field(default_factory=lambda: Strict("default"))
    pool_size: int = 20
    pumps: int = 1
    max_claim_batch: int = 32
    max_outcome_batch: int | None = None  # None: falls back to max_claim_batch
    poll_interval: float = 1.0
    lease_duration: float = 30.0
    heartbeat_interval: float | None = None  # None: lease_duration / 3
    maintenance_interval: float = 30.0
    drain_timeout: float = 30.0
    # The Django DATABASES alias whose jobs this group's pumps claim. None: the databases of the
    # backends that declare its queues (the worker places the group on each, see
    # backwave/databases.py). A plain name here: the core never opens a database.
    database: str | None = None
    retention: Retention = field(default_factory=Retention)  # cluster-wide: set from BACKWAVE["RETENTION"]

    @property
    def outcome_batch(self) -> int:
        """How many outcomes buffer before a write: max_outcome_batch, else max_claim_batch."""
        return self.max_outcome_batch if self.max_outcome_batch is not None else self.max_claim_batch

    @property
    def heartbeat_every(self) -> float:
        """Seconds between lease renewals: heartbeat_interval, else a third of the lease."""
        return self.heartbeat_interval if self.heartbeat_interval is not None else self.lease_duration / 3.0


def validate_groups(groups: Iterable[WorkerGroupOptions]) -> list[WorkerGroupOptions]:
    """Reject what the seeds reject: a duplicate group name, and fewer than one pump.

    Like the original, the other dials carry no upper bound: they are the operator's to set.
    Types and signs are checked where the options are parsed from settings or flags.
    """
    seen: set[str] = set()
    validated = []
    for group in groups:
        if group.name in seen:
            raise WorkerGroupConfigError(f"Worker Group '{group.name}' is configured twice.")
        if group.pumps < 1:
            raise WorkerGroupConfigError(f"Worker Group '{group.name}' must run at least one Pump (Pumps = {group.pumps}).")
        seen.add(group.name)
        validated.append(group)
    return validated

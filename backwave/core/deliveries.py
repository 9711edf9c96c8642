"""What a failed delivery to a transition observer turns into: retried after a backoff, or dead.

The observer loop (backwave/shell/observers.py) is a plain claim -> deliver -> settle loop on one
thread, with no lease to heartbeat and no events arriving from elsewhere, so it needs no state
machine of its own; its one decision is here, pure, beside the job backoff it reuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backoff import retry_delay


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryOptions:
    """How the observer loop delivers (BACKWAVE["OBSERVER_*"], checked by conf)."""

    max_deliveries: int = 8  # tries per transition before it is left dead
    backoff_base: float = 1.0  # seconds before the first retry; doubles per try
    backoff_max: float = 600.0  # cap on one retry's delay
    lease: float = 60.0  # seconds a claim lasts: a delivery pass must end within it
    batch: int = 32  # transitions claimed per pass
    poll_interval: float = 1.0  # seconds between claims while none are due

    def __post_init__(self):
        if self.max_deliveries < 1 or self.batch < 1:
            raise ValueError(f"max_deliveries and batch must be 1 or more (got {self.max_deliveries}, {self.batch})")
        if not (self.lease > 0 and self.poll_interval > 0 and 0 <= self.backoff_base <= self.backoff_max):
            raise ValueError(f"lease and poll_interval must be above 0 and 0 <= backoff_base <= backoff_max: {self!r}")


def after_failure(*, deliveries: int, options: DeliveryOptions, jitter: float) -> tuple[bool, float]:
    """(dead, seconds until the next try) after the ``deliveries``-th try failed."""
    if deliveries >= options.max_deliveries:
        return True, 0.0
    return False, retry_delay(attempt=deliveries, base=options.backoff_base, cap=options.backoff_max, jitter=jitter)

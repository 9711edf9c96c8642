"""Exponential backoff with full jitter, the randomness passed in so the core stays deterministic."""

from __future__ import annotations


def retry_delay(*, attempt: int, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based).

    The ceiling doubles per attempt from ``base`` up to ``cap``; the delay is drawn uniformly from
    its upper half (``jitter`` in [0, 1)), so retries spread out yet never come sooner than half the
    nominal wait. Half-jitter rather than full jitter keeps a retry from landing at once.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, got {attempt}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    if base < 0 or cap < 0:
        raise ValueError(f"backoff base and cap must not be negative (base={base}, cap={cap})")
    ceiling = min(cap, base * (2.0 ** min(attempt - 1, 62)))
    return ceiling / 2.0 + (ceiling / 2.0) * jitter

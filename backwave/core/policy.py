"""Dispatch policies: which queues a pump claims from, and in what shape.

A policy turns a pass's free capacity into claims (``plan``). ``Strict`` asks for everything in
one claim over all its queues (queue order first, then priority: one round-trip). ``Weighted``
splits the capacity by smooth weighted round-robin and asks each queue separately (one claim per
queue per pass); the driver keeps the round-robin state between passes so long-run shares follow
the weights, and leaves out of the next pass a queue whose claim came back short, so an idle
queue's share goes to the busy ones (work-conserving).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Claim = tuple[tuple[str, ...], int]  # (queues, limit) of one ClaimJobs


class DispatchPolicy:
    """Base of the policies; ``queues`` is every queue the policy serves."""

    queues: tuple[str, ...]

    def plan(self, limit: int, state: dict[str, int], skip: frozenset[str] = frozenset()) -> list[Claim]:
        """The claims of one pass for ``limit`` free slots. ``state`` is the policy's own
        round-robin memory, kept by the driver; ``skip`` are queues found empty this pass."""
        raise NotImplementedError

    def only(self, queues) -> DispatchPolicy:
        """The same policy over the subset of its queues that are in ``queues`` (kept in the
        policy's own order, with their weights): how a group whose queues live in several
        databases gets one policy per database."""
        raise NotImplementedError(f"{type(self).__name__} cannot be restricted to some of its queues")


def _check_queue_names(kind: str, queues) -> None:
    if not queues:
        raise ValueError(f"{kind}() needs at least one queue name")
    for queue in queues:
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"{kind}() queue names must be non-empty strings, got {queue!r}")
    if len(set(queues)) != len(queues):
        raise ValueError(f"{kind}() names a queue twice: {tuple(queues)!r}")


@dataclass(frozen=True, slots=True, init=False)
class Strict(DispatchPolicy):
    """Claim the whole free capacity from these queues in one batch: queue order, then priority."""

    queues: tuple[str, ...]

    def __init__(self, *queues: str):
        _check_queue_names("Strict", queues)
        object.__setattr__(self, "queues", tuple(queues))

    def __repr__(self):
        return f"Strict({', '.join(repr(q) for q in self.queues)})"

    def only(self, queues) -> Strict:
        keep = set(queues)
        return Strict(*(q for q in self.queues if q in keep))

    def plan(self, limit: int, state: dict[str, int], skip: frozenset[str] = frozenset()) -> list[Claim]:
        queues = tuple(q for q in self.queues if q not in skip)
        return [(queues, limit)] if queues and limit > 0 else []


@dataclass(frozen=True, slots=True, init=False)
class Weighted(DispatchPolicy):
    """Share the capacity between queues in proportion to their weights (smooth weighted
    round-robin), one claim per queue per pass."""

    weights: Mapping[str, int] = field(default_factory=dict)
    queues: tuple[str, ...] = ()

    def __init__(self, weights: Mapping[str, int]):
        if not isinstance(weights, Mapping):
            raise ValueError(f"Weighted() takes a dict of queue name to weight, got {weights!r}")
        _check_queue_names("Weighted", list(weights))
        for queue, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise ValueError(f"Weighted() weight of queue {queue!r} must be a whole number of at least 1, got {weight!r}")
        object.__setattr__(self, "weights", dict(weights))
        object.__setattr__(self, "queues", tuple(weights))

    def __repr__(self):
        return f"Weighted({dict(self.weights)!r})"

    def only(self, queues) -> Weighted:
        keep = set(queues)
        return Weighted({q: w for q, w in self.weights.items() if q in keep})

    def plan(self, limit: int, state: dict[str, int], skip: frozenset[str] = frozenset()) -> list[Claim]:
        weights = {q: w for q, w in self.weights.items() if q not in skip}
        if not weights or limit <= 0:
            return []
        shares = dict.fromkeys(weights, 0)
        total = sum(weights.values())
        for _ in range(limit):
            # Smooth weighted round-robin (as nginx does): every queue earns its weight, the
            # richest takes the slot and pays the total. Over any run of `total` slots each queue
            # gets exactly its weight, spread out rather than in bursts.
            for queue, weight in weights.items():
                state[queue] = state.get(queue, 0) + weight
            chosen = max(weights, key=lambda q: state[q])
            state[chosen] -= total
            shares[chosen] += 1
        return [((queue,), count) for queue, count in shares.items() if count]

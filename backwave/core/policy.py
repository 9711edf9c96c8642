"""Dispatch policies: which queues a pump claims from, and in what shape."""

from __future__ import annotations

from dataclasses import dataclass


class DispatchPolicy:
    """Base of the policies; ``queues`` is every queue the policy serves."""

    queues: tuple[str, ...]


@dataclass(frozen=True, slots=True, init=False)
class Strict(DispatchPolicy):
    """Claim the whole free capacity from these queues in one priority-ordered batch."""

    queues: tuple[str, ...]

    def __init__(self, *queues: str):
        if not queues:
            raise ValueError("Strict() needs at least one queue name")
        if len(set(queues)) != len(queues):
            raise ValueError(f"Strict() names a queue twice: {queues!r}")
        object.__setattr__(self, "queues", tuple(queues))

    def __repr__(self):
        return f"Strict({', '.join(repr(q) for q in self.queues)})"

"""The Node Driver's ledger of commands in flight, and of results still due for given-up ones.

Every command the driver waits for is sent through ``send`` and settled by ``landed`` or
``failed`` when its result arrives. Results come back in the order their commands were sent, so
each kind keeps its own queue, oldest first (several claims of one dispatch pass may be in
flight; of every other kind, at most one). When the lease is lost the commands in flight under
it are not waited for any more, but their results still come: ``lease_lost`` turns each into a
stale result due, and ``swallow_stale`` counts one off when it arrives while nothing of its kind
is in flight (a result of a command sent since is that command's).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .commands import Command


@dataclass
class Ledger:
    _sent: dict[type[Command], deque[tuple[Command, float]]] = field(default_factory=dict)
    _stale: dict[type[Command], int] = field(default_factory=dict)

    def send(self, command: Command, now: float) -> Command:
        """Record ``command`` as sent at ``now``; returns it, to go into the command list."""
        self._sent.setdefault(type(command), deque()).append((command, now))
        return command

    def busy(self, kind: type[Command]) -> bool:
        """Whether a command of ``kind`` is in flight."""
        return bool(self._sent.get(kind))

    def sent(self, kind: type[Command]) -> Sequence[tuple[Command, float]]:
        """The commands of ``kind`` in flight with when each was sent, oldest first: the ledger's
        own queue, to read and not to change."""
        return self._sent.get(kind, ())

    def oldest(self, kind: type[Command]) -> Command | None:
        """The command of ``kind`` the next result of that kind answers, if one is in flight."""
        sent = self._sent.get(kind)
        return sent[0][0] if sent else None

    def landed(self, kind: type[Command]) -> tuple[Command, float]:
        """The oldest command of ``kind`` was answered: no longer in flight. Returns it and when
        it was sent."""
        return self._settle(kind)

    def failed(self, kind: type[Command]) -> tuple[Command, float]:
        """The oldest command of ``kind`` failed: no longer in flight either (the caller undoes
        what it had counted on). Returns it and when it was sent."""
        return self._settle(kind)

    def _settle(self, kind: type[Command]) -> tuple[Command, float]:
        if not self.busy(kind):
            raise LookupError(f"no {kind.__name__} is in flight")
        return self._sent[kind].popleft()

    def lease_lost(self, kinds: Iterable[type[Command]]) -> None:
        """Stop waiting for the commands of ``kinds`` in flight: their results are stale when
        they come."""
        for kind in kinds:
            sent = self._sent.get(kind)
            if sent:
                self._stale[kind] = self._stale.get(kind, 0) + len(sent)
                sent.clear()

    def swallow_stale(self, kind: type[Command]) -> bool:
        """Whether a result of ``kind`` arriving now is a stale one; if so it is counted off."""
        if not self._stale.get(kind) or self.busy(kind):
            return False
        self._stale[kind] -= 1
        return True

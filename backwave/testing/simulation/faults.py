"""The fault injector: what the simulator does to the cluster during the fault phase.

Faults come at random moments (exponentially spaced, ``Scenario.fault_every`` apart on average):
a node crashes (its pumps and workers die; its leases lapse; it restarts later with new pumps);
a pump stalls past its lease (its workers go on); a node's clock jumps forward (the driver's
``now``, not the database's); a pump is asked to drain (a new one takes its place); a database
refuses every statement for a while (an outage); a queue is paused or resumed; with
``Config.lease_losses``, one pump is cut off from its database for up to a few leases while its
handlers run on (a network partition: its lease lapses under handlers still running). Besides,
any statement may fail transiently (``Scenario.transient_rate``), wake-up hints are lost or
duplicated, and with ``Config.ambiguous_faults`` a failed statement may have committed.
At the quiesce every fault stops, every node comes back and every queue resumes. (A job that
kills its process is not a fault: it goes on doing so in the quiesce.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backwave.core import events as ev

if TYPE_CHECKING:  # world.py imports this mixin
    from .world import Node, SimPump


class Faults:
    """The fault half of World (a mixin: it works on World's state)."""

    def _fault_for_statement(self, pump: SimPump) -> str | None:
        if self.quiescing:
            return None
        if self.t < self.outage_until[pump.database] or self.t < pump.cut_off_until:
            return "before"
        if self.rng.random() < self.scenario.transient_rate:
            return "after" if self.config.ambiguous_faults and self.rng.random() < 0.5 else "before"
        return None

    def _fault(self) -> None:
        if self.quiescing:
            return
        rng = self.rng
        kinds = ("crash", "pause", "jump", "drain", "outage", "pause-queue")
        kind = rng.choice(kinds + ("cut-off",) if self.config.lease_losses else kinds)
        live = [p for p in self.pumps if p.alive]
        if kind == "crash":
            node = rng.choice(self.nodes)
            if node.alive:
                self._crash(node)
                self.at(self.t + rng.uniform(0.5, 3 * self.options.lease_duration), self._restart, node)
        elif kind == "pause" and live:
            pump = rng.choice(live)
            pump.paused_until = self.t + self.options.lease_duration * rng.uniform(0.5, 2.5)
            self.log.line(self.t, pump.name, f"FAULT pause until {pump.paused_until:.3f}")
        elif kind == "jump":
            node = rng.choice(self.nodes)
            jump = rng.uniform(0.05, 1.5 * self.options.lease_duration)
            node.offset += jump
            self.log.line(self.t, f"n{node.index}", f"FAULT clock jump +{jump:.3f}")
            for pump in node.pumps.values():
                if pump.alive:
                    self.kick(pump)
        elif kind == "drain" and live:
            pump = rng.choice(live)
            self.log.line(self.t, pump.name, "FAULT drain requested")
            self._post(pump, ev.DrainRequested, timeout=rng.choice((0.0, 0.2, 1.0, 5.0)))
        elif kind == "pause-queue":
            queue = rng.choice(self.options.policy.queues)
            index = self._some_database()
            database = self.databases[index]
            limit, paused = database.queues.get(queue, (None, False))
            database.queues[queue] = (limit, not paused)
            self.log.line(self.t, _db_name(index), f"FAULT queue {queue} {'resumed' if paused else 'paused'}")
        elif kind == "outage":
            index = self._some_database()
            self.outage_until[index] = self.t + rng.uniform(0.2, 0.8 * self.options.lease_duration)
            self.log.line(self.t, _db_name(index), f"FAULT outage until {self.outage_until[index]:.3f}")
        elif kind == "cut-off" and live:
            pump = rng.choice(live)
            pump.cut_off_until = self.t + self.options.lease_duration * rng.uniform(0.5, 2.5)
            self.log.line(self.t, pump.name, f"FAULT cut off from its database until {pump.cut_off_until:.3f}")
        self.at(self.t + rng.expovariate(1 / self.scenario.fault_every), self._fault)

    def _some_database(self) -> int:
        return self.rng.randrange(len(self.databases)) if len(self.databases) > 1 else 0

    def _crash(self, node: Node) -> None:
        node.alive = False
        self.log.line(self.t, f"n{node.index}", "FAULT crash")
        for pump in node.pumps.values():
            pump.stopped = True  # for good: a restart brings new pumps
            self.invariants.died(pump)

    def _restart(self, node: Node) -> None:
        if not node.alive:
            self.log.line(self.t, f"n{node.index}", "restart")
            self._boot(node)

    def _quiesce(self) -> None:
        """Faults stop; every node comes back; from here every job must reach a final state."""
        self.quiescing = True
        self.outage_until = [0.0] * len(self.databases)
        self.log.line(self.t, "world", "quiesce")
        for database in self.databases:
            for queue, (limit, _) in list(database.queues.items()):
                database.queues[queue] = (limit, False)
        for node in self.nodes:
            if not node.alive:
                self._boot(node)
        self.invariants.check_store()


def _db_name(index: int) -> str:
    return f"db{index}" if index else "db"

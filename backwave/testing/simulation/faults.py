"""The fault injector: what the simulator does to the cluster during the fault phase.

Faults come at random moments (exponentially spaced, ``Scenario.fault_every`` apart on average):
a node crashes (its pumps and workers die; its leases lapse; it restarts later with new pumps);
a pump stalls past its lease (its workers go on); a node's clock jumps forward (the driver's
``now``, not the database's); a pump is asked to drain (a new one takes its place); the database
refuses every statement for a while (an outage); a queue is paused or resumed. Besides, any
statement may fail transiently (``Scenario.transient_rate``), wake-up hints are lost or
duplicated, and with ``Config.ambiguous_faults`` a failed statement may have committed.
At the quiesce every fault stops, every node comes back and every queue resumes.
"""

from __future__ import annotations

from backwave.core import events as ev


class Faults:
    """The fault half of World (a mixin: it works on World's state)."""

    def _fault_for_statement(self) -> str | None:
        if self.quiescing:
            return None
        if self.t < self.outage_until:
            return "before"
        if self.rng.random() < self.scenario.transient_rate:
            return "after" if self.config.ambiguous_faults and self.rng.random() < 0.5 else "before"
        return None

    def _fault(self) -> None:
        if self.quiescing:
            return
        rng = self.rng
        kind = rng.choice(("crash", "pause", "jump", "drain", "outage", "pause-queue"))
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
            limit, paused = self.database.queues.get(queue, (None, False))
            self.database.queues[queue] = (limit, not paused)
            self.log.line(self.t, "db", f"FAULT queue {queue} {'resumed' if paused else 'paused'}")
        elif kind == "outage":
            self.outage_until = self.t + rng.uniform(0.2, 0.8 * self.options.lease_duration)
            self.log.line(self.t, "db", f"FAULT outage until {self.outage_until:.3f}")
        self.at(self.t + rng.expovariate(1 / self.scenario.fault_every), self._fault)

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
        self.outage_until = 0.0
        self.log.line(self.t, "world", "quiesce")
        for queue, (limit, _) in list(self.database.queues.items()):
            self.database.queues[queue] = (limit, False)
        for node in self.nodes:
            if not node.alive:
                self._boot(node)
        self.invariants.check_store()


"""What must hold after every step of a simulated run, and the report when it does not."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .world import SimPump, World

FINAL = frozenset({"succeeded", "failed", "cancelled", "quarantined"})


class SimulationBug(AssertionError):
    """An invariant broke, the driver refused an event, or the store refused a statement."""


class Invariants:
    """The checks, and the bookkeeping they need beyond the store's own tables."""

    def __init__(self, world: World):
        self.world = world
        self.pool_size = world.options.pool_size
        self.enqueued: set[int] = set()
        self.final: dict[int, str] = {}  # job id -> the final state it first reached
        self.lease_owner: dict[uuid.UUID, SimPump] = {}
        self.claimed_under: dict[tuple[int, int], uuid.UUID] = {}  # (job, attempt) -> lease
        self.executing: dict[int, list[tuple[SimPump, uuid.UUID, int]]] = {}  # job -> (pump, lease, attempt) per live worker

    # ---- after every driver step --------------------------------------------------------------

    def check_driver(self, pump: SimPump) -> None:
        if pump.driver.unreported > self.pool_size:
            raise SimulationBug(f"{pump.name} holds {pump.driver.unreported} claimed-and-unreported jobs, pool_size is {self.pool_size}")

    # ---- after every statement ----------------------------------------------------------------

    def check_store(self) -> None:
        db = self.world.database
        per_lease: Counter[uuid.UUID] = Counter()
        per_queue: Counter[str] = Counter()
        suspects: Counter[uuid.UUID] = Counter()
        for job_id in self.enqueued:
            job = db.jobs.get(job_id)
            if job is None:
                if job_id not in self.final:
                    raise SimulationBug(f"job {job_id} is gone without having finished: lost")
                continue
            state = job.state
            if state in FINAL:
                first = self.final.setdefault(job_id, state)
                if first != state:
                    raise SimulationBug(f"job {job_id} finished as {first}, and is now {state}: an outcome applied twice")
            elif job_id in self.final:
                raise SimulationBug(f"job {job_id} finished as {self.final[job_id]} and is {state} again: resurrected")
            if state == "running":
                if job.lease_id not in db.leases:
                    raise SimulationBug(f"job {job_id} runs under lease {job.lease_id}, which no longer exists: no one can ever free it (lost)")
                per_lease[job.lease_id] += 1
                per_queue[job.queue] += 1
            if job.attempts - job.forgiven_attempts > job.max_attempts:
                raise SimulationBug(
                    f"job {job_id} is at attempt {job.attempts} ({job.forgiven_attempts} forgiven) of {job.max_attempts}"
                )
            if not 0 <= job.forgiven_attempts <= job.attempts:
                raise SimulationBug(f"job {job_id} has {job.forgiven_attempts} forgiven attempts of {job.attempts}")
            if state == "running" and job.suspect:
                suspects[job.lease_id] += 1
        for lease_id, running in per_lease.items():
            if running > self.pool_size:
                owner = self.lease_owner.get(lease_id)
                raise SimulationBug(f"{running} jobs run under the lease of {owner.name if owner else lease_id}, pool_size is {self.pool_size}")
        for lease_id, running in suspects.items():
            if running > 1:
                owner = self.lease_owner.get(lease_id)
                raise SimulationBug(f"{running} suspects run under the lease of {owner.name if owner else lease_id}: a second death would convict both")
        for queue, running in per_queue.items():
            limit = db.queues.get(queue, (None, False))[0]
            if limit is not None and running > limit:
                raise SimulationBug(f"{running} jobs of queue {queue} run at once; its concurrency limit is {limit}")
        decisive: Counter[int] = Counter()
        for (job_id, number), attempt in db.attempts.items():
            if attempt.state == "succeeded":
                decisive[job_id] += 1
                if decisive[job_id] > 1:
                    raise SimulationBug(f"job {job_id} has two succeeded attempts: an outcome applied twice")
            job = db.jobs.get(job_id)
            if job is not None and number > job.attempts:
                raise SimulationBug(f"job {job_id} has an attempt row {number} past its attempt count {job.attempts}")
        self._check_executions()

    # ---- handlers on workers ------------------------------------------------------------------

    def started(self, pump: SimPump, job_id: int, lease: uuid.UUID, attempt: int) -> None:
        self.executing.setdefault(job_id, []).append((pump, lease, attempt))
        # A pump's pool has pool_size threads: a handler beyond them would wait in the queue,
        # claimed and unstarted, while its lease ticks. Abandoned handlers still hold theirs.
        handlers = sum(1 for runs in self.executing.values() for runner, _, _ in runs if runner is pump)
        if handlers > self.pool_size:
            raise SimulationBug(f"{pump.name} runs {handlers} handlers at once (abandoned ones included), pool_size is {self.pool_size}")
        self._check_executions()

    def finished(self, pump: SimPump, job_id: int, attempt: int) -> None:
        runs = self.executing.get(job_id, [])
        for index, (runner, _, number) in enumerate(runs):
            if runner is pump and number == attempt:
                del runs[index]
                break

    def died(self, pump: SimPump) -> None:
        for runs in self.executing.values():
            runs[:] = [run for run in runs if run[0] is not pump]

    def _check_executions(self) -> None:
        """An attempt running under a live lease owns its row: the row runs under that lease, at
        that attempt. So no row is ever under two live leases at once, and no write (a late one,
        a stale one) can finish or release a job while a live attempt of it runs."""
        db, now = self.world.database, self.world._db_now()
        for job_id, runs in self.executing.items():
            live = [(pump, lease, number) for pump, lease, number in runs if (row := db.leases.get(lease)) is not None and row.expires_at > now]
            if not live:
                continue
            if len({lease for _, lease, _ in live}) > 1:
                names = ", ".join(f"{pump.name} (attempt {number})" for pump, _, number in live)
                raise SimulationBug(f"job {job_id} runs on {names} under {len(live)} live leases at once")
            job = db.jobs.get(job_id)
            pump, lease, number = live[0]
            if job is None or job.state != "running" or job.lease_id != lease or job.attempts != number:
                shown = "gone" if job is None else f"{job.state}, attempt {job.attempts}"
                raise SimulationBug(
                    f"job {job_id} is {shown} while attempt {number} of it still runs on {pump.name} under a live lease: "
                    "a write changed a row its lease still holds"
                )

    # ---- the quiesce ----------------------------------------------------------------------------

    def all_finished(self) -> bool:
        jobs = self.world.database.jobs
        return all(job_id in self.final or jobs[job_id].state in FINAL for job_id in self.enqueued)

    def stuck(self, deadline: float) -> None:
        """Raise the report of every job that did not reach a final state by ``deadline``."""
        db = self.world.database
        lines = []
        for job_id in sorted(self.enqueued):
            job = db.jobs.get(job_id)
            if job is None or job.state in FINAL:
                continue
            where = ""
            if job.lease_id is not None:
                owner = self.lease_owner.get(job.lease_id)
                lease = db.leases.get(job.lease_id)
                where = f" under lease {job.lease_id.hex[:8]} of {owner.name if owner else '?'}"
                if owner is not None:
                    where += f" (pump {'alive' if owner.alive else 'dead'}, driver {owner.driver.state.value}, knows the job: {job_id in owner.driver._executing})"
                if lease is not None:
                    where += f", lease expires at +{(lease.expires_at - self.world._db_now()).total_seconds():.1f}s"
            lines.append(f"  job {job_id}: {job.state}, attempt {job.attempts}/{job.max_attempts}{where}")
        raise SimulationBug(f"not every job reached a final state by t={deadline:.1f} (faults stopped at {self.world.scenario.fault_phase:.1f}):\n" + "\n".join(lines))

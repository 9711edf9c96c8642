"""Randomized traces: thousands of steps of claims, finishes, writes, faults, hints and ticks.

The randomness lives here, in a seeded ``random.Random``; the driver takes none. A small model of
the store and the job threads answers the driver's commands in issue order (one store connection),
while job finishes, hints and ticks arrive in between at random. After every step the model checks
backpressure and the driver's bookkeeping against its own; at the end the pump drains and every
finished job must have been acknowledged in exactly one write.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass

import pytest

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import NodeDriver, State
from backwave.core.jobs import ClaimedJob, OutcomeKind

from .helpers import LEASE, make_options


@dataclass
class InFlight:
    command: cmd.Command
    rides_write: bool  # a ClaimJobs right behind a WriteOutcomes in the same list


class Model:
    def __init__(self, seed: int, **option_overrides):
        self.rng = random.Random(seed)
        self.options = make_options(**option_overrides)
        self.driver = NodeDriver(self.options)
        self.now = 0.0
        self.inflight: deque[InFlight] = deque()
        self.running: dict[int, ClaimedJob] = {}
        self.held: set[int] = set()  # claimed by the pump and not yet acknowledged by a write
        self.results: dict[int, tuple[ClaimedJob, str]] = {}
        self.acked: Counter[int] = Counter()
        self.claimed = self.lost = 0
        self.next_id = 1
        self.draining = False
        self.released_unrun: set[int] = set()
        self.fail_rate = 0.1

    # ---- driving ------------------------------------------------------------------------------

    def send(self, event: ev.Event) -> None:
        self.now = max(self.now, event.now)
        commands = self.driver.handle(event)
        self.check_commands(commands)
        for i, command in enumerate(commands):
            if isinstance(command, cmd.ExecuteJob):
                self.running[command.job.id] = command.job
            else:
                rides = isinstance(command, cmd.ClaimJobs) and i > 0 and isinstance(commands[i - 1], cmd.WriteOutcomes)
                self.inflight.append(InFlight(command, rides))
        self.check_state()

    def step(self) -> None:
        roll = self.rng.random()
        if self.inflight and roll < 0.5:
            self.answer_head()
        elif self.running and roll < 0.75:
            self.finish_one()
        elif roll < 0.82:
            self.send(ev.HintReceived(now=self.now))
        elif roll < 0.87:
            self.send(ev.Tick(now=self.now))  # a stray, early tick
        elif not self.inflight:
            wake = self.driver.next_wakeup()
            self.now = max(self.now, wake if wake is not None else self.now) + self.rng.choice([0.0, 0.0, 0.01])
            self.send(ev.Tick(now=self.now))
        else:
            self.now += self.rng.random() * 0.05  # time passes while the store works

    def finish_one(self) -> None:
        job = self.running.pop(self.rng.choice(sorted(self.running)))
        result = self.rng.choice(["succeeded", "succeeded", "succeeded", "failed", "unroutable"])
        self.results[job.id] = (job, result)
        self.send(ev.JobFinished(now=self.now, job_id=job.id, attempt=job.attempt, result=result, jitter=self.rng.random()))

    def answer_head(self) -> None:
        item = self.inflight.popleft()
        command = item.command
        failable = isinstance(
            command,
            (
                cmd.ClaimJobs,
                cmd.WriteOutcomes,
                cmd.ExpireLeases,
                cmd.MintSchedules,
                cmd.PurgeJobs,
                cmd.RollUpStats,
                cmd.ReconcileLease,
            ),
        )
        if failable and self.rng.random() < self.fail_rate:
            self.send(ev.StoreFailed(now=self.now, command=command, jitter=self.rng.random()))
            if isinstance(command, cmd.WriteOutcomes) and self.inflight and self.inflight[0].rides_write:
                self.send(ev.StoreFailed(now=self.now, command=self.inflight.popleft().command))
            return
        match command:
            case cmd.ClaimJobs(limit=limit):
                self.answer_claim(limit)
            case cmd.WriteOutcomes(outcomes=outcomes):
                ids = [o.job_id for o in outcomes]
                applied = {i for i in ids if self.rng.random() > 0.1}
                self.acked.update(ids)
                self.lost += len(ids) - len(applied)
                self.held -= set(ids)
                for outcome in outcomes:
                    self.check_outcome(outcome)
                self.send(ev.OutcomesWritten(now=self.now, applied=frozenset(applied)))
            case cmd.RenewLease():
                self.send(ev.LeaseRenewed(now=self.now, held=True))
            case cmd.ExpireLeases():
                self.send(ev.LeasesExpired(now=self.now, released=self.rng.randint(0, 3)))
            case cmd.MintSchedules():
                self.send(ev.SchedulesMinted(now=self.now, minted=self.rng.randint(0, 2)))
            case cmd.PurgeJobs(limit=limit):
                self.send(ev.JobsPurged(now=self.now, purged=self.rng.choice([0, limit])))
            case cmd.RollUpStats(limit=limit):
                self.send(ev.StatsRolledUp(now=self.now, rolled=self.rng.choice([0, limit])))
            case cmd.PurgePumps():
                self.send(ev.PumpsPurged(now=self.now, purged=0))
            case cmd.AnalyzeTables():
                self.send(ev.TablesAnalyzed(now=self.now, tables=self.rng.choice([(), ("backwave_job",)])))
            case cmd.ReleaseJobs(job_ids=ids):
                self.send(ev.JobsReleased(now=self.now, released=frozenset(ids)))
            case cmd.ReleaseLease():
                self.send(ev.LeaseReleased(now=self.now))
            case cmd.ReconcileLease(known=known):
                # The model's failed claims never committed: nothing unknown runs under the lease.
                assert {job_id for job_id, _ in known} >= self.held, "the reconcile would give back jobs the driver holds"
                self.send(ev.LeaseReconciled(now=self.now, released=frozenset()))
            case _:
                raise AssertionError(f"unexpected command {command!r}")

    def answer_claim(self, limit: int) -> None:
        k = self.rng.choice([0, limit, limit, self.rng.randint(0, limit)])
        jobs = []
        for _ in range(k):
            max_attempts = self.rng.randint(1, 3)
            jobs.append(
                ClaimedJob(
                    id=self.next_id,
                    task_path="t.x",
                    queue="default",
                    priority=0,
                    payload=None,
                    attempt=self.rng.randint(1, max_attempts),
                    max_attempts=max_attempts,
                    backoff_base=1.0,
                    backoff_max=60.0,
                )
            )
            self.next_id += 1
        self.claimed += k
        if self.driver.state is State.RUNNING:
            self.held |= {job.id for job in jobs}
        else:
            self.released_unrun |= {job.id for job in jobs}
        self.send(ev.ClaimReturned(now=self.now, jobs=tuple(jobs)))

    # ---- checks -------------------------------------------------------------------------------

    def check_commands(self, commands: list[cmd.Command]) -> None:
        pool, d = self.options.pool_size, self.driver
        for i, command in enumerate(commands):
            if isinstance(command, cmd.ClaimJobs):
                assert not self.draining, "claimed while draining"
                assert not any(isinstance(f.command, cmd.ClaimJobs) for f in self.inflight), "two claims in flight"
                assert command.lease_id == LEASE
                # The command before it, a ReconcileLease that runs first aside.
                before = [c for c in commands[:i] if not isinstance(c, cmd.ReconcileLease)]
                riding = bool(before) and isinstance(before[-1], cmd.WriteOutcomes)
                # Free capacity: pool minus executing minus buffered (and minus the write in flight,
                # unless the claim rides behind that very write and runs after it lands).
                capacity = pool - d.unreported + (len(before[-1].outcomes) if riding else 0)
                assert 1 <= command.limit <= min(capacity, self.options.max_claim_batch), (command.limit, capacity)
            elif isinstance(command, cmd.WriteOutcomes):
                assert not any(isinstance(f.command, cmd.WriteOutcomes) for f in self.inflight), "two writes in flight"
                ids = [o.job_id for o in command.outcomes]
                assert 1 <= len(ids) <= self.options.outcome_batch
                assert len(set(ids)) == len(ids)
                assert set(ids) <= set(self.results) and set(ids) <= self.held
            elif isinstance(command, cmd.ReleaseJobs):
                assert set(command.job_ids) <= self.released_unrun
            elif isinstance(command, cmd.ExecuteJob):
                assert command.job.id not in self.released_unrun

    def check_state(self) -> None:
        d = self.driver
        assert d.unreported <= self.options.pool_size
        if d.state is not State.STOPPED:
            assert d.unreported == len(self.held)
            assert d.executing == len(self.running)
        assert d.stats.abandoned == 0

    def check_outcome(self, outcome) -> None:
        job, result = self.results[outcome.job_id]
        assert outcome.attempt == job.attempt
        if result == "succeeded":
            assert outcome.kind is OutcomeKind.SUCCEEDED
        elif result == "unroutable":
            assert outcome.kind is OutcomeKind.QUARANTINED
        elif job.attempt >= job.max_attempts:
            assert outcome.kind is OutcomeKind.FAILED
        else:
            assert outcome.kind is OutcomeKind.RETRY and 0.5 <= outcome.retry_delay < 60.0

    # ---- the whole run ------------------------------------------------------------------------

    def run(self, steps: int) -> None:
        self.send(ev.Started(now=0.0))
        assert self.inflight.popleft().command == cmd.OpenLease()
        self.send(ev.LeaseOpened(now=0.0, lease_id=LEASE))
        for _ in range(steps):
            self.step()
        self.draining = True
        self.send(ev.DrainRequested(now=self.now, timeout=1e9))
        for _ in range(50_000):
            if self.driver.state is State.STOPPED:
                break
            self.step()
        assert self.driver.state is State.STOPPED
        self.check_final()

    def check_final(self) -> None:
        d = self.driver
        assert self.running == {} and self.held == set()
        # Every finished job was acknowledged in exactly one write; nothing else was written.
        assert set(self.acked) == set(self.results)
        assert set(self.acked.values()) <= {1}
        assert d.stats.applied + d.stats.lost == len(self.results)
        assert d.stats.lost == self.lost
        assert d.stats.claimed == self.claimed == len(self.results) + len(self.released_unrun)
        assert d.stats.abandoned == 0


OPTION_SETS = {
    "pool-1": dict(pool_size=1),
    "pool-16-batch-32": dict(pool_size=16, max_claim_batch=32),
    "pool-64-batch-8": dict(pool_size=64, max_claim_batch=8),
    "outcome-batch-1": dict(pool_size=8, max_outcome_batch=1),
    "pool-20-claim-5-outcome-3": dict(pool_size=20, max_claim_batch=5, max_outcome_batch=3),
    "defaults": dict(),
}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_random_trace_keeps_backpressure_and_reports_every_job_once(name, seed):
    model = Model(seed * 7919 + len(name), **OPTION_SETS[name])
    model.run(steps=3000)
    assert len(model.results) > 50  # the trace did real work
    assert model.driver.stats.store_faults > 0


def test_random_trace_without_faults_loses_nothing_to_retries():
    model = Model(42, pool_size=10, max_claim_batch=4)
    model.fail_rate = 0.0
    model.run(steps=3000)
    assert model.driver.stats.store_faults == 0
    assert model.driver.stats.writes >= 1


def test_the_model_catches_an_over_admitting_driver(monkeypatch):
    """The checks can fail: a driver whose free capacity forgot buffered outcomes claims too much."""
    forgetful = property(lambda self: max(0, self.options.pool_size - len(self._executing) - self._claim_limit))
    monkeypatch.setattr(NodeDriver, "free_slots", forgetful)
    model = Model(5, pool_size=4, max_claim_batch=4)
    with pytest.raises(AssertionError, match=r"\(\d+, \d+\)"):  # (limit, capacity)
        model.run(steps=2000)

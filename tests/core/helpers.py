"""A small trace harness for the Node Driver: events in, commands out, no clock, no threads.

``Trace`` wraps one driver and a trace-local ``now``; each method sends one event and returns the
commands the driver answered with, so a test reads as the protocol conversation it checks::

    t = Trace.running(pool_size=4)          # Started, LeaseOpened(LEASE): first claim in flight
    assert t.returned(*t.jobs.make(2)) == [ExecuteJob(...), ExecuteJob(...)]
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.core.driver import ROLLUP_BATCH, NodeDriver
from backwave.core.jobs import ClaimedJob
from backwave.core.options import MAX_OUTCOME_LINGER, Retention, WorkerGroupOptions

LEASE = uuid.UUID(int=0xB0A7)
LEASE2 = uuid.UUID(int=0xB0A8)
QUEUES = ("default",)


# Traces keep nothing to purge unless a test asks: maintenance is then the three steps every
# run has (purging and rollup pages are traced on their own in test_driver_maintenance.py).
NO_RETENTION = Retention(
    succeeded=None, failed=None, cancelled=None, quarantined=None, pumps=None, task_stats_minutely=None, task_stats_hourly=None
)
MAINTENANCE = [cmd.ExpireLeases(), cmd.MintSchedules(), cmd.RollUpStats(limit=ROLLUP_BATCH), cmd.AnalyzeTables()]


# Traces batch outcomes by the full batch and the idle pool alone unless a test asks: the
# linger is traced on its own in test_driver_outcomes.py.
NO_LINGER = MAX_OUTCOME_LINGER

# Traces claim for free threads alone unless a test asks: claim-ahead is traced on its own in
# test_driver_claim_ahead.py.
NO_CLAIM_AHEAD = 0


def make_options(**overrides) -> WorkerGroupOptions:
    """WorkerGroupOptions named 'g' on Strict('default'), with any dial overridden."""
    overrides.setdefault("name", "g")
    overrides.setdefault("retention", NO_RETENTION)
    overrides.setdefault("outcome_linger", NO_LINGER)
    overrides.setdefault("claim_ahead", NO_CLAIM_AHEAD)
    return WorkerGroupOptions(**overrides)


class JobFactory:
    """Makes ClaimedJob values with fresh, increasing ids (1, 2, 3, ...)."""

    def __init__(self, start: int = 1):
        self.next_id = start

    def one(self, **overrides) -> ClaimedJob:
        values = dict(
            id=self.next_id,
            task_path="app.tasks.work",
            queue="default",
            priority=0,
            payload={"n": self.next_id},
            attempt=1,
            max_attempts=3,
            backoff_base=2.0,
            backoff_max=100.0,
        )
        values.update(overrides)
        self.next_id = max(self.next_id, values["id"]) + 1
        return ClaimedJob(**values)

    def make(self, n: int, **overrides) -> tuple[ClaimedJob, ...]:
        return tuple(self.one(**overrides) for _ in range(n))


def claim(limit: int, lease_id: uuid.UUID = LEASE, queues: tuple[str, ...] = QUEUES) -> cmd.ClaimJobs:
    return cmd.ClaimJobs(lease_id=lease_id, queues=queues, limit=limit)


def execute(*jobs: ClaimedJob) -> list[cmd.ExecuteJob]:
    return [cmd.ExecuteJob(job=job) for job in jobs]


def ids_of(write: cmd.WriteOutcomes) -> list[int]:
    return [outcome.job_id for outcome in write.outcomes]


def of_type(commands: Iterable[cmd.Command], kind: type) -> list:
    return [c for c in commands if isinstance(c, kind)]


def observable(driver: NodeDriver) -> dict:
    """What the shell can see of a driver: compared before and after a rejected event."""
    return {
        "state": driver.state,
        "lease_id": driver.lease_id,
        "executing": driver.executing,
        "unreported": driver.unreported,
        "free_slots": driver.free_slots,
        "next_wakeup": driver.next_wakeup(),
        "stats": copy.copy(driver.stats),
    }


def internals(driver: NodeDriver) -> dict:
    """Every attribute of the driver, deep-copied: 'unchanged' means all of it."""
    return copy.deepcopy(vars(driver))


class Trace:
    """One driver plus a trace clock. Every method sends one event and returns the commands."""

    def __init__(self, **option_overrides):
        self.options = make_options(**option_overrides)
        self.driver = NodeDriver(self.options)
        self.now = 0.0
        self.jobs = JobFactory()
        self.log: list[tuple[ev.Event, list[cmd.Command]]] = []

    # ---- set-ups ----------------------------------------------------------------------------

    @classmethod
    def running(cls, lease_id: uuid.UUID = LEASE, **option_overrides) -> Trace:
        """Started at 0, LeaseOpened at 0: RUNNING, the first claim in flight, and the start-up
        maintenance run's rollup answered (a short page), so later runs send one again."""
        trace = cls(**option_overrides)
        assert trace.started() == [cmd.OpenLease()]
        first = trace.opened(lease_id)
        assert first == [claim(trace.first_claim_limit, lease_id, trace.driver.queues), *MAINTENANCE]
        assert trace.rolled_up(0) == []
        return trace

    @classmethod
    def with_jobs(cls, n: int, **option_overrides) -> tuple[Trace, tuple[ClaimedJob, ...]]:
        """RUNNING with the first claim answered by ``n`` jobs (n must fit the first claim)."""
        trace = cls.running(**option_overrides)
        jobs = trace.jobs.make(n)
        trace.returned(*jobs)
        return trace, jobs

    @property
    def first_claim_limit(self) -> int:
        return min(self.options.pool_size, self.options.max_claim_batch)

    # ---- sending ----------------------------------------------------------------------------

    def send(self, event: ev.Event) -> list[cmd.Command]:
        self.now = max(self.now, event.now)
        commands = self.driver.handle(event)
        self.log.append((event, commands))
        return commands

    def at(self, now: float) -> Trace:
        self.now = now
        return self

    def _now(self, now: float | None) -> float:
        return self.now if now is None else now

    def started(self, now=None):
        return self.send(ev.Started(now=self._now(now)))

    def opened(self, lease_id: uuid.UUID = LEASE, now=None):
        return self.send(ev.LeaseOpened(now=self._now(now), lease_id=lease_id))

    def tick(self, now=None):
        return self.send(ev.Tick(now=self._now(now)))

    def tick_at_wakeup(self):
        wake = self.driver.next_wakeup()
        assert wake is not None, "the driver asked for no wake-up"
        return self.tick(max(self.now, wake))

    def hint(self, now=None):
        return self.send(ev.HintReceived(now=self._now(now)))

    def returned(self, *jobs: ClaimedJob, now=None):
        return self.send(ev.ClaimReturned(now=self._now(now), jobs=tuple(jobs)))

    def finished(self, job: ClaimedJob | int, result="succeeded", *, attempt=None, jitter=0.0, now=None):
        job_id = job if isinstance(job, int) else job.id
        if attempt is None:
            attempt = 1 if isinstance(job, int) else job.attempt
        return self.send(ev.JobFinished(now=self._now(now), job_id=job_id, attempt=attempt, result=result, jitter=jitter))

    def written(self, applied: Iterable[int] | cmd.WriteOutcomes, now=None, released=0, busy: Iterable[int] = ()):
        if isinstance(applied, cmd.WriteOutcomes):
            applied = [job_id for job_id in ids_of(applied) if job_id not in set(busy)]
        event = ev.OutcomesWritten(now=self._now(now), applied=frozenset(applied), released=released, busy=frozenset(busy))
        return self.send(event)

    def renewed(self, held=True, now=None):
        return self.send(ev.LeaseRenewed(now=self._now(now), held=held))

    def expired(self, released=0, now=None):
        return self.send(ev.LeasesExpired(now=self._now(now), released=released))

    def jobs_released(self, ids: Iterable[int], now=None, busy: Iterable[int] = ()):
        return self.send(ev.JobsReleased(now=self._now(now), released=frozenset(ids), busy=frozenset(busy)))

    def lease_released(self, now=None):
        return self.send(ev.LeaseReleased(now=self._now(now)))

    def failed(self, command: cmd.Command, now=None, jitter=0.5):
        return self.send(ev.StoreFailed(now=self._now(now), command=command, jitter=jitter))

    def minted(self, minted=0, now=None):
        return self.send(ev.SchedulesMinted(now=self._now(now), minted=minted))

    def purged(self, purged=0, now=None):
        return self.send(ev.JobsPurged(now=self._now(now), purged=purged))

    def rolled_up(self, rolled=0, now=None):
        return self.send(ev.StatsRolledUp(now=self._now(now), rolled=rolled))

    def drain(self, timeout=30.0, now=None):
        return self.send(ev.DrainRequested(now=self._now(now), timeout=timeout))


def play(driver: NodeDriver, events: Iterable[ev.Event]) -> list[list[cmd.Command]]:
    """Feed events in order; return the command list answered to each."""
    return [driver.handle(event) for event in events]

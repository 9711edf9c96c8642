"""What one seed simulates: the cluster, its options, the jobs, and how hard the faults hit.

Everything here is drawn from the seed's own random source before the run starts, so a seed
names one scenario and one run. ``Config`` holds the knobs that are not drawn (the CLI's flags);
a failing seed's replay command repeats the ones that differ from the defaults.

The knobs after ``quiesce_limit`` widen what the first version of the simulator drew and checked.
Each one can be switched off on its own (``--no-hostile-values``), to hunt one kind of defect at a
time; ``CLASSIC`` switches all of them off, and then a seed draws exactly what it drew before
they existed (so the seeds pinned in tests/sim against that version replay their old scenario).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields, replace

from backwave.core.options import Retention, WorkerGroupOptions
from backwave.core.policy import Strict, Weighted

QUEUES = ("q0", "q1", "q2")
UNKNOWN_TASK = "sim.tasks.unknown"  # no handler: every attempt is unroutable
TASK = "sim.tasks.work"
CRASH_TASK = "sim.tasks.crash"  # every attempt kills its node (os._exit, a segfault, the OOM killer)
RUNNING_JOB = -1  # a cancel of whichever job runs at its moment
# What a Unique may cover: ready always (a waiting job too), running by default, finished states
# only beside running (backwave/tasking/task.py refuses the rest at definition).
UNIQUE_STATES = (("ready",), ("ready", "running"), ("ready", "running", "succeeded"), ("ready", "running", "succeeded", "failed"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Knobs of the simulation that a seed does not draw."""

    faults: bool = True  # inject faults during the fault phase
    ambiguous_faults: bool = False  # a statement may commit and still report a fault (lost reply)
    max_jobs: int = 30
    max_nodes: int = 3
    fault_phase: float = 20.0  # virtual seconds of faults (and enqueues) before the quiesce
    quiesce_limit: float = 240.0  # virtual seconds the quiesce may take before it counts as stuck
    hostile_values: bool = True  # handlers return values and raise errors PostgreSQL cannot store
    tiny_backoffs: bool = True  # zero and tiny backoffs: a retry may be due at once
    crashers: bool = True  # some jobs kill their node on every attempt, during the quiesce too
    lease_losses: bool = True  # one pump cut off from its database, handlers that hang
    pool_threads: bool = True  # pool_size handler threads per pump; an abandoned handler keeps its thread
    thread_checks: bool = True  # only the pump's own thread touches its driver
    observers: bool = True  # task_finished receivers and transition observers see each applied outcome once, and nothing else
    report_checks: bool = True  # once at rest, no pump keeps anything of an attempt it will never hear of again
    max_databases: int = 2  # databases a seed may draw; every node runs its pumps on each one
    dependencies: bool = True  # some jobs wait for earlier ones (after=, cancel or run on failure)
    admission: bool = True  # queues under per-key concurrency and rate limits, jobs with limit keys
    claim_ahead: bool = True  # pumps may hold claimed jobs beyond their threads (core/slots.py)
    # Time limits (and hard ones), cancels at random moments, unique tasks, more snoozes, named
    # observers, and handlers that outlive their attempt (past a time limit, a cancel ignored).
    job_control: bool = True

    def flags(self) -> str:
        """The CLI flags that reproduce this config (only those that differ from the defaults)."""
        default = Config()
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                parts.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                parts.append(f"{flag} {value}")
        return " ".join(parts)


CLASSIC = Config(
    hostile_values=False,
    tiny_backoffs=False,
    crashers=False,
    lease_losses=False,
    pool_threads=False,
    thread_checks=False,
    observers=False,
    report_checks=False,
    max_databases=1,
    dependencies=False,
    admission=False,
    claim_ahead=False,
    job_control=False,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A job the producer enqueues at ``at`` (virtual seconds)."""

    at: float
    queue: str
    priority: int
    max_attempts: int
    backoff_base: float
    backoff_max: float
    task_path: str
    delay: float  # run_at this many seconds after the enqueue (0: due at once)
    database: int = 0  # which of the scenario's databases it is enqueued on
    # Ancestors: (index of an earlier JobSpec of the same database, on_failure). The simulated
    # operator holds nothing, so a seed draws only "cancel" and "run".
    after: tuple[tuple[int, str], ...] = ()
    limit_key: str | None = None  # the key of its queue's per-key concurrency limit
    timeout: float | None = None  # seconds one attempt may run (the task's time limit)
    # Uniqueness: the key (per task), the period whose windows it holds for (None: for as long as
    # the job is covered) and the states it covers (ready always).
    unique_key: str | None = None
    unique_period: float | None = None
    unique_states: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One seed's cluster, jobs and fault rates."""

    seed: int
    nodes: int
    pumps_per_node: int
    options: WorkerGroupOptions
    jobs: tuple[JobSpec, ...]
    fail_rate: float  # chance an attempt of the work task raises
    long_job_rate: float  # chance an attempt runs longer than the lease
    fault_phase: float
    fault_every: float  # mean virtual seconds between injected faults
    transient_rate: float  # chance a statement fails transiently (fault phase)
    hint_loss: float
    hint_dup: float
    concurrency_limits: dict[str, int]  # queues with a cluster-wide concurrency limit
    databases: int = 1
    hostile_rate: float = 0.0  # chance an attempt returns or raises what PostgreSQL cannot store
    hang_rate: float = 0.0  # chance an attempt hangs for several leases
    key_limits: dict[str, int] = field(default_factory=dict)  # queues with a per-key concurrency limit
    rate_limits: dict[str, tuple[int, float]] = field(default_factory=dict)  # queues with (starts, per seconds)
    key_rate_limits: dict[str, int] = field(default_factory=dict)  # queues with starts per key per rate window
    # Job control: (when, JobSpec index) of each cancel the operator asks for; the hard limit
    # (seconds a handler told to stop may go on before its process ends itself; None: none); the
    # chance a handler told to stop does so; the share of successes that snooze instead.
    cancels: tuple[tuple[float, int], ...] = ()  # RUNNING_JOB for the index: a job running then
    hard_time_limit: float | None = None
    obey_rate: float = 1.0
    snooze_rate: float | None = None  # None: world.SNOOZE_RATE, as before the knob

    @classmethod
    def draw(cls, seed: int, config: Config, rng: random.Random) -> Scenario:
        queues = tuple(rng.sample(QUEUES, rng.randint(1, len(QUEUES))))
        if len(queues) > 1 and rng.random() < 0.5:
            policy = Weighted({q: rng.randint(1, 4) for q in queues})
        else:
            policy = Strict(*queues)
        pool_size = rng.randint(1, 4)
        lease = rng.choice((3.0, 5.0, 8.0))
        retention = rng.choice(
            (
                Retention(succeeded=None, failed=None, cancelled=None, quarantined=None, pumps=None),
                Retention(
                    succeeded=rng.uniform(5, 30),
                    failed=rng.uniform(5, 60),
                    cancelled=None,
                    quarantined=rng.uniform(5, 60),
                    pumps=60.0,
                ),
            )
        )
        options = WorkerGroupOptions(
            name="sim",
            policy=policy,
            pool_size=pool_size,
            max_claim_batch=rng.randint(1, pool_size + 1),
            max_outcome_batch=rng.choice((None, 1, 2, 3)),
            poll_interval=rng.choice((0.2, 0.5, 1.0)),
            lease_duration=lease,
            maintenance_interval=rng.choice((0.5, 1.0, 2.0, 4.0)),
            drain_timeout=rng.choice((0.0, 0.5, 2.0)),
            retention=retention,
            claim_ahead=0,  # drawn in _widen, with the knobs that came later
        )
        phase = config.fault_phase * rng.uniform(0.5, 1.0)
        count = rng.randint(max(1, config.max_jobs // 4), config.max_jobs)
        jobs = tuple(
            JobSpec(
                at=rng.uniform(0, phase * 0.8),
                queue=rng.choice(queues),
                priority=rng.choice((0, 0, 0, 5, -5)),
                max_attempts=rng.randint(1, 4),
                backoff_base=rng.choice((0.0, 1e-6, 0.001, 0.05, 0.2, 1.0) if config.tiny_backoffs else (0.05, 0.2, 1.0)),
                backoff_max=rng.choice((0.0, 0.5, 2.0) if config.tiny_backoffs else (0.5, 2.0)),
                task_path=UNKNOWN_TASK if rng.random() < 0.05 else TASK,
                delay=rng.uniform(0, 3) if rng.random() < 0.2 else 0.0,
            )
            for _ in range(count)
        )
        scenario = cls(
            seed=seed,
            nodes=rng.randint(1, config.max_nodes),
            pumps_per_node=rng.randint(1, 2),
            options=options,
            jobs=tuple(sorted(jobs, key=lambda j: j.at)),
            fail_rate=rng.choice((0.0, 0.1, 0.3, 0.6)),
            long_job_rate=rng.choice((0.0, 0.02, 0.1)),
            fault_phase=phase,
            fault_every=rng.uniform(0.5, 4.0),
            transient_rate=rng.choice((0.0, 0.02, 0.1)) if config.faults else 0.0,
            hint_loss=rng.choice((0.0, 0.3, 1.0)) if config.faults else 0.0,
            hint_dup=rng.choice((0.0, 0.3)) if config.faults else 0.0,
            concurrency_limits={q: rng.randint(1, 3) for q in queues if rng.random() < 0.3},
        )
        return scenario._widen(config, rng)

    def _widen(self, config: Config, rng: random.Random) -> Scenario:
        """The draws of the knobs that came after the first version (but tiny_backoffs, which
        only widens two choices), after all of its draws and each only when its knob is on, so
        that CLASSIC draws exactly what that version drew."""
        jobs, changes = self.jobs, {}
        if config.max_databases > 1:
            changes["databases"] = databases = rng.randint(1, config.max_databases)
            jobs = tuple(replace(job, database=rng.randrange(databases)) for job in jobs)
        if config.crashers:
            crash_rate = rng.choice((0.0, 0.03, 0.1))
            jobs = tuple(
                replace(job, task_path=CRASH_TASK) if job.task_path == TASK and rng.random() < crash_rate else job for job in jobs
            )
        if config.hostile_values:
            changes["hostile_rate"] = rng.choice((0.0, 0.01, 0.05))
        if config.lease_losses:
            changes["hang_rate"] = rng.choice((0.0, 0.02, 0.1))
        if config.dependencies:
            # A source of its own (a str seed is hashed with SHA-512, whatever PYTHONHASHSEED): a
            # seed that draws no dependency replays the run it replayed before they existed.
            jobs = _with_dependencies(jobs, random.Random(f"dependencies:{self.seed}"))
        if config.admission:
            # From a generator of its own, so that the draws after this one (the world's) stay
            # as they were: turning the knob on changes only what it adds.
            rng = random.Random(f"admission:{self.seed}")
            queues = sorted({job.queue for job in jobs})
            changes["key_limits"] = {q: rng.randint(1, 2) for q in queues if rng.random() < 0.4}
            changes["rate_limits"] = {q: (rng.randint(1, 4), rng.choice((0.5, 1.0, 2.0))) for q in queues if rng.random() < 0.3}
            changes["key_rate_limits"] = {q: rng.randint(1, 2) for q in queues if rng.random() < 0.3}
            keys = ("k0", "k1", "k2")
            jobs = tuple(replace(job, limit_key=rng.choice(keys) if rng.random() < 0.7 else None) for job in jobs)
        if config.claim_ahead:
            admitted = {*changes.get("key_limits", ()), *changes.get("rate_limits", ()), *changes.get("key_rate_limits", ())}
            # As the worker's settings rule (backwave/conf.py): no claim-ahead beside an admission limit.
            if not admitted & set(self.options.policy.queues):
                ahead = random.Random(f"claim-ahead:{self.seed}").choice((None, 1, 2, 5))
                changes["options"] = replace(self.options, claim_ahead=ahead)
        if config.job_control:
            jobs = self._draw_job_control(jobs, changes, random.Random(f"job-control:{self.seed}"))
        return replace(self, jobs=jobs, **changes)

    def _draw_job_control(self, jobs: tuple[JobSpec, ...], changes: dict, rng: random.Random) -> tuple[JobSpec, ...]:
        """Time limits, unique tasks and cancels (the knob job_control), from a source of their own."""
        timeout_rate = rng.choice((0.0, 0.2, 0.5))
        unique_rate = rng.choice((0.0, 0.3, 0.6))
        drawn = []
        for job in jobs:
            if rng.random() < timeout_rate:
                job = replace(job, timeout=rng.choice((0.05, 0.2, 1.0, 3.0)))
            if job.task_path == TASK and not job.after and rng.random() < unique_rate:  # a unique job waits for no one
                job = replace(
                    job,
                    unique_key=rng.choice(("u0", "u1")),
                    unique_period=rng.choice((None, None, 1.0, 5.0)),
                    unique_states=rng.choice(UNIQUE_STATES),
                )
            drawn.append(job)
        cancel_rate = rng.choice((0.0, 0.1, 0.3))
        # Most soon after the enqueue (the job ready, waiting or running), some much later.
        cancels = [
            (job.at + (rng.expovariate(1 / 0.3) if rng.random() < 0.7 else rng.uniform(0, 10)), index)
            for index, job in enumerate(drawn)
            if rng.random() < cancel_rate
        ]
        # And some of whichever job runs at that moment: handlers are short, so a cancel drawn
        # for a job rarely finds it running.
        cancels += [(rng.uniform(0, self.fault_phase), RUNNING_JOB) for _ in range(rng.choice((0, 1, 3)))]
        changes["cancels"] = tuple(sorted(cancels))
        changes["hard_time_limit"] = rng.choice((None, None, 0.5, 2.0))
        changes["obey_rate"] = rng.choice((0.0, 0.5, 0.9))
        changes["snooze_rate"] = rng.choice((0.02, 0.1))
        options = changes.get("options", self.options)
        changes["options"] = replace(options, cancel_grace=rng.choice((0.05, 0.3, 2.0)))
        return tuple(drawn)


def _with_dependencies(jobs: tuple[JobSpec, ...], rng: random.Random) -> tuple[JobSpec, ...]:
    """Some jobs wait for one to three earlier jobs of their database: chains, fan-ins, DAGs."""
    rate = rng.choice((0.0, 0.3, 0.6))
    drawn = []
    for index, job in enumerate(jobs):
        earlier = [i for i in range(index) if jobs[i].database == job.database]
        if earlier and rng.random() < rate:
            picked = rng.sample(earlier, min(len(earlier), rng.randint(1, 3)))
            job = replace(job, after=tuple((i, "run" if rng.random() < 0.2 else "cancel") for i in sorted(picked)))
        drawn.append(job)
    return tuple(drawn)

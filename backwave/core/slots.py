"""Backpressure for the Node Driver: which jobs hold the pool's ``pool_size`` slots.

A pump never holds more than ``pool_size`` jobs that are claimed and not yet reported. A
finished job whose outcome sits in the buffer (or in a write in flight) still holds its slot,
because it still holds its lease; the slot reopens when the write lands. An attempt abandoned
with a lost lease holds its slot too, until its JobFinished arrives: its handler still runs on
one of the pool's threads, and a job claimed for that thread would wait in the pool's queue,
unstarted, while its lease ticks. So every job the pump claims starts at once. A drain never
waits for abandoned handlers: their jobs are no longer the pump's.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from . import claims
from . import commands as cmd
from .jobs import ClaimedJob, Outcome
from .options import WorkerGroupOptions
from .outcomes import OutcomeBuffer, cancel_ignored, cancelled_before_start, learned, timed_out

# Task paths whose durations a pump remembers: those of its registry in practice; a flood of
# unknown paths (unroutable rows) starts the memory over rather than growing it.
DURATIONS_KEPT = 1_000


@dataclass
class Slots:
    options: WorkerGroupOptions
    outcomes: OutcomeBuffer  # the driver's: outcomes waiting or being written hold their slots
    executing: dict[int, ClaimedJob] = field(default_factory=dict)
    # (job id, attempt) given up with a lost lease (or at a drain's end) whose handler has not
    # returned yet: each still occupies a thread of the pool, so it still takes a slot.
    abandoned: set[tuple[int, int]] = field(default_factory=set)
    # Executing jobs whose attempt must end by then (driver's clock): a time limit, or a cancel's
    # grace. See ** in core/transitions.py.
    deadlines: dict[int, float] = field(default_factory=dict)
    # Executing jobs whose cancel was requested: who asked.
    cancels: dict[int, str] = field(default_factory=dict)
    # When each executing job started (driver's clock), each task's learned attempt duration
    # (start to JobFinished), and the executing jobs' expected finishes as a max-heap of
    # (-expected finish, job id, attempt), whose entries of jobs no longer executing are dropped
    # when they reach the top (see expected_idle_at).
    started: dict[int, float] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    expected_finishes: list[tuple[float, int, int]] = field(default_factory=list)

    @property
    def unreported(self) -> int:
        """Jobs claimed and not yet reported: executing, buffered, or in a write in flight."""
        return len(self.executing) + len(self.outcomes.waiting) + len(self.outcomes.writing)

    def claimable_after_write(self) -> int:
        """How many jobs a claim that rides the write in flight may ask for: it runs after the
        write lands, so the slots the write frees are counted as free."""
        held = len(self.executing) + len(self.outcomes.waiting) + len(self.abandoned)
        return min(self.options.pool_size - held, self.options.max_claim_batch)

    def held_attempts(self) -> set[tuple[int, int]]:
        """(job id, attempt) of every job claimed and not yet reported: executing, buffered, written."""
        return {(job.id, job.attempt) for job in self.executing.values()} | self.outcomes.attempts()

    def take(self, jobs: tuple[ClaimedJob, ...], asked: int) -> int:
        """Take the jobs a claim returned, dropping the buffered outcomes they make obsolete;
        returns how many. ValueError, before any change, when the answer cannot be taken."""
        # An outcome still buffered for a job the claim just returned is from an older attempt
        # whose write did land (its reply was lost): the job ran on and is due again. It is
        # obsolete, and it must not share a batch with the new attempt's outcome.
        claimed_ids = {job.id for job in jobs}
        obsolete = self.outcomes.of_jobs(claimed_ids)
        if reason := claims.refusal(
            jobs, asked, self.executing, unreported=self.unreported, obsolete=obsolete,
            abandoned=len(self.abandoned), pool_size=self.options.pool_size,
        ):
            raise ValueError(reason)
        if obsolete:
            self.outcomes.drop(claimed_ids)
        return obsolete

    def start(self, jobs: tuple[ClaimedJob, ...], now: float) -> list[cmd.Command]:
        """ExecuteJob for each job; a job cancelled while an earlier attempt ran is not run, its
        CANCELLED outcome buffered instead (holding its slot like any outcome)."""
        commands: list[cmd.Command] = []
        for job in jobs:
            if job.cancel_requested_by is not None:
                self.outcomes.add(cancelled_before_start(job), now)
                continue
            self.executing[job.id] = job
            self.started[job.id] = now
            heapq.heappush(self.expected_finishes, self._expected_finish(job))
            if job.timeout is not None:
                self.deadlines[job.id] = now + job.timeout
            commands.append(cmd.ExecuteJob(job=job))
        if len(self.expected_finishes) > 4 * len(self.executing) + 64:
            # Entries of ended jobs pile up under a long job's: rebuilt from what executes.
            self.expected_finishes = [self._expected_finish(job) for job in self.executing.values()]
            heapq.heapify(self.expected_finishes)
        return commands

    def expected_idle_at(self) -> float | None:
        """When the last executing job is expected to finish; None when none executes."""
        heap = self.expected_finishes
        while heap:
            negative_finish, job_id, attempt = heap[0]
            job = self.executing.get(job_id)
            if job is not None and job.attempt == attempt:
                return -negative_finish
            heapq.heappop(heap)
        return None

    def next_deadline(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    def cancel(self, job_id: int, by: str, deadline: float) -> ClaimedJob | None:
        """Note a cancel of an executing job (once): its attempt must end by ``deadline`` at the
        latest. The job, or None when it is not executing here or its cancel is already noted."""
        job = self.executing.get(job_id)
        if job is None or job_id in self.cancels:
            return None
        self.cancels[job_id] = by
        self.deadlines[job_id] = min(self.deadlines.get(job_id, deadline), deadline)
        return job

    def end_overdue(self, now: float) -> list[Outcome]:
        """End every attempt past its deadline without its handler: its outcome buffered, the
        attempt abandoned (its slot stays taken until the handler returns)."""
        ended = []
        for job_id in [job_id for job_id, deadline in self.deadlines.items() if deadline <= now]:
            job = self.executing.pop(job_id)
            self.started.pop(job_id, None)
            del self.deadlines[job_id]
            by = self.cancels.pop(job_id, None)
            outcome = timed_out(job) if by is None else cancel_ignored(job, by)
            self.abandoned.add((job.id, job.attempt))
            self.outcomes.add(outcome, now)
            ended.append(outcome)
        return ended

    def finishing(self, job_id: int, attempt: int) -> ClaimedJob | None:
        """The executing job whose attempt finished, or None for an abandoned attempt (forgotten
        now). ValueError when the pump knows no such attempt."""
        job = self.executing.get(job_id)
        if job is not None and job.attempt == attempt:
            return job
        if (job_id, attempt) in self.abandoned:
            # Abandoned with a lost lease (perhaps finishing after its job was claimed again).
            self.abandoned.discard((job_id, attempt))
            return None
        if job is None:
            raise ValueError(f"job {job_id} is not executing on this pump")
        raise ValueError(f"job {job_id} runs attempt {job.attempt}, not {attempt}")

    def committed(self, job_id: int, now: float) -> None:
        """The attempt wrote its own outcome (an atomic task): its slot reopens at once."""
        self._learn(self.executing.pop(job_id), now)

    def report(self, outcome: Outcome, now: float) -> None:
        """The attempt's outcome, buffered, holds its job's slot from now on."""
        self._learn(self.executing.pop(outcome.job_id), now)
        self.deadlines.pop(outcome.job_id, None)
        self.cancels.pop(outcome.job_id, None)
        self.outcomes.add(outcome, now)

    def abandon_all(self) -> int:
        """Give up every executing job; returns how many."""
        # Keyed by attempt: one pump may give up two attempts of one job (claimed again after the
        # first lease lapsed, then that lease lost too) and hear of both, in either order.
        self.abandoned.update((job.id, job.attempt) for job in self.executing.values())
        count = len(self.executing)
        self.executing.clear()
        self.started.clear()
        self.expected_finishes.clear()
        self.deadlines.clear()
        self.cancels.clear()
        return count

    def _expected_finish(self, job: ClaimedJob) -> tuple[float, int, int]:
        """The executing job's heap entry: (-(its start + its task's learned duration), id, attempt).
        A task not measured yet is expected to finish at once: waiting for it costs at most the
        linger, as before anything was learned."""
        return (-(self.started[job.id] + self.durations.get(job.task_path, 0.0)), job.id, job.attempt)

    def _learn(self, job: ClaimedJob, now: float) -> None:
        """The job's handler returned at ``now``: its task's duration learns from this attempt."""
        started = self.started.pop(job.id, now)
        if job.task_path not in self.durations and len(self.durations) >= DURATIONS_KEPT:
            self.durations.clear()
        self.durations[job.task_path] = learned(self.durations.get(job.task_path), max(0.0, now - started))

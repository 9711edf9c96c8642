"""Backpressure for the Node Driver: which jobs hold the pool's slots.

A pump runs at most ``pool_size`` jobs at once, one a thread, and holds at most ``pool_size +
jobs_ahead`` jobs that are claimed and not yet reported. A finished job whose outcome sits in the
buffer (or in a write in flight) still holds its slot, because it still holds its lease; the
slot reopens when the write lands. An attempt abandoned with a lost lease holds its thread too,
until its JobFinished arrives: its handler still runs on one of the pool's threads.

Claimed ahead: beyond its threads, a pump may hold up to ``jobs_ahead`` claimed jobs that wait,
in claim order, for a thread (``queued``); a thread that finishes takes the next one at once,
so the pool keeps running while the write and the next claim are on their way. Only while the
pool's work is known to be short (CLAIM_AHEAD_HORIZON, see ``claims_ahead``): otherwise the
room is the free threads alone, and every job claimed starts at once. A job waiting here is not
executing: it has no deadline yet, a cancel ends it without running it, a drain gives it back
(so does an attempt ended past its deadline, whose handler may keep its thread for ever), and a
lost lease drops it (it lapses with the lease, like the rest).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from . import claims
from . import commands as cmd
from .jobs import ClaimedJob, Outcome
from .options import CLAIM_AHEAD_HORIZON, WorkerGroupOptions
from .outcomes import OutcomeBuffer, cancel_ignored, cancelled_before_start, learned, timed_out

# Task paths whose durations a pump remembers: those of its registry in practice; a flood of
# unknown paths (unroutable rows) starts the memory over rather than growing it.
DURATIONS_KEPT = 1_000


@dataclass
class Slots:
    options: WorkerGroupOptions
    outcomes: OutcomeBuffer  # the driver's: outcomes waiting or being written hold their slots
    executing: dict[int, ClaimedJob] = field(default_factory=dict)
    queued: deque[ClaimedJob] = field(default_factory=deque)  # claimed ahead, waiting for a thread
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
    long_tasks: int = 0  # tasks in ``durations`` learned to take CLAIM_AHEAD_HORIZON or more

    @property
    def unreported(self) -> int:
        """Jobs claimed and not yet reported: executing, claimed ahead, buffered, or in a write in flight."""
        return len(self.executing) + len(self.queued) + len(self.outcomes.waiting) + len(self.outcomes.writing)

    @property
    def free_threads(self) -> int:
        return self.options.pool_size - len(self.executing) - len(self.abandoned)

    @property
    def capacity(self) -> int:
        """How many jobs the pump may hold now: its threads, and its room ahead while it claims ahead."""
        return self.options.pool_size + (self.options.jobs_ahead if self.claims_ahead() else 0)

    def claims_ahead(self) -> bool:
        """Whether the pool's work is known to be short: some task has been seen finishing, none
        has taken CLAIM_AHEAD_HORIZON or more on average, every executing job is of a task seen
        finishing, and no abandoned handler holds a thread (one given up with its lease or past
        its deadline may never return). A job claimed ahead then waits for a thread about as
        long as a job of the pool has left to run, which is under the horizon."""
        if not self.options.jobs_ahead or not self.durations or self.long_tasks or self.abandoned:
            return False
        durations = self.durations
        return all(job.task_path in durations for job in self.executing.values())

    def claimable_after_write(self) -> int:
        """How many jobs a claim that rides the write in flight may ask for: it runs after the
        write lands, so the slots the write frees are counted as free."""
        held = len(self.executing) + len(self.queued) + len(self.outcomes.waiting) + len(self.abandoned)
        return min(self.capacity - held, self.options.max_claim_batch)

    def held_attempts(self) -> set[tuple[int, int]]:
        """(job id, attempt) of every job claimed and not yet reported: executing, claimed ahead, buffered, written."""
        held = {(job.id, job.attempt) for job in self.executing.values()} | self.outcomes.attempts()
        return held | {(job.id, job.attempt) for job in self.queued}

    def take(self, jobs: tuple[ClaimedJob, ...], asked: int) -> int:
        """Take the jobs a claim returned, dropping the buffered outcomes they make obsolete;
        returns how many. ValueError, before any change, when the answer cannot be taken."""
        # An outcome still buffered for a job the claim just returned is from an older attempt
        # whose write did land (its reply was lost): the job ran on and is due again. It is
        # obsolete, and it must not share a batch with the new attempt's outcome.
        claimed_ids = {job.id for job in jobs}
        obsolete = self.outcomes.of_jobs(claimed_ids)
        # Against the most the pump may ever hold: the room ahead may have closed since the
        # claim was sent (a job of a task not seen before started meanwhile), and the jobs
        # beyond the free threads then wait their turn.
        if reason := claims.refusal(
            jobs,
            asked,
            self.executing,
            queued={job.id for job in self.queued},
            unreported=self.unreported,
            obsolete=obsolete,
            abandoned=len(self.abandoned),
            pool_size=self.options.pool_size,
            ahead=self.options.jobs_ahead,
            busy=len(self.outcomes.held_back),
        ):
            raise ValueError(reason)
        if obsolete:
            self.outcomes.drop(claimed_ids)
        return obsolete

    def start(self, jobs: tuple[ClaimedJob, ...], now: float) -> list[cmd.Command]:
        """ExecuteJob for each job a thread is free for, in claim order; the rest wait, claimed
        ahead, behind those already waiting. A job cancelled while an earlier attempt ran is not
        run, its CANCELLED outcome buffered instead (holding its slot like any outcome)."""
        for job in jobs:
            if job.cancel_requested_by is not None:
                self.outcomes.add(cancelled_before_start(job), now)
            else:
                self.queued.append(job)
        return self.start_queued(now)

    def start_queued(self, now: float) -> list[cmd.Command]:
        """ExecuteJob for the jobs claimed ahead that threads are free for, oldest claim first."""
        commands: list[cmd.Command] = []
        free = self.free_threads
        while free > 0 and self.queued:
            job = self.queued.popleft()
            free -= 1
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

    def cancel_queued(self, job_id: int, by: str, now: float) -> bool:
        """A cancel of a job claimed ahead: it never runs, its CANCELLED outcome is buffered (and
        holds its slot like any outcome). False when no such job waits here."""
        for job in self.queued:
            if job.id == job_id:
                self.queued.remove(job)
                self.outcomes.add(cancelled_before_start(job, by=by), now)
                return True
        return False

    def give_back_queued(self) -> tuple[ClaimedJob, ...]:
        """Every job claimed ahead, taken out to be given back unstarted (a drain, a hung handler)."""
        jobs = tuple(self.queued)
        self.queued.clear()
        return jobs

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
        """Give up every executing job and every job claimed ahead; returns how many. The jobs
        claimed ahead run no handler, so they hold no thread: they lapse with the lease."""
        # Keyed by attempt: one pump may give up two attempts of one job (claimed again after the
        # first lease lapsed, then that lease lost too) and hear of both, in either order.
        self.abandoned.update((job.id, job.attempt) for job in self.executing.values())
        count = len(self.executing) + len(self.queued)
        self.executing.clear()
        self.queued.clear()
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
            self.long_tasks = 0
        before = self.durations.get(job.task_path)
        after = self.durations[job.task_path] = learned(before, max(0.0, now - started))
        self.long_tasks += (after >= CLAIM_AHEAD_HORIZON) - (before is not None and before >= CLAIM_AHEAD_HORIZON)

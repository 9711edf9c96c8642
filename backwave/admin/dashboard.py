"""The dashboard at the top of the BackWave admin: is it healthy, what is stuck, what failed and why.

Every number is one bounded read (``backwave/store/operator.py``, SQL in ``queries.sql``):

* **Health**: the queues with due jobs that no live pump serves (degraded, whatever the pumps
  say), each pump judged by its lease (``Pump.objects.with_shown_status``), the wake-up hint
  listener sessions against the worker processes with a live pump, and the last maintenance run
  (the statistics rollup's, any node's) with how far the rollup is behind.
* **Throughput and failures** per minute (1 h) or hour (24 h): the rollup's buckets plus the
  attempts it has not reached yet, read live up to a cap.
* **Queues**: depths as on the Queues page, and the age of the oldest due job of each queue.
* **Stuck**: running jobs whose lease lapsed, or that have run for longer than ``STUCK_FACTOR``
  times their task's p95 over the last 24 hours (and at least ``STUCK_FLOOR`` seconds).
* **Recent failures**: the last attempts that did not succeed, each with its error message.

Each part needs the view permission of the page it summarises (``SECTIONS``), and a part the
user may not see is neither drawn nor read: a user who may view only schedules gets the app
index without a dashboard, not the task paths and error messages of the jobs they may not list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections

from .. import taskstats
from ..core.health import UnservedQueue
from ..databases import console_databases
from ..models import Pump, ShownPumpStatus
from ..ops import stats
from ..store import operator

# The ranges an operator picks from: name -> (seconds, bucket resolution, label).
RANGES = {"1h": (3600, 60, "last hour, per minute"), "24h": (86400, 3600, "last 24 hours, per hour")}
DEFAULT_RANGE = "1h"
TAIL_CAP = 50_000  # attempts past the rollup's watermark read live for the charts
BEHIND_CAP = 100_000  # attempts past the watermark counted for "the rollup is behind by"
RUNNING_SHOWN = 500  # running jobs read (longest-running first) to find the stuck ones
FAILURES_SHOWN = 10
STUCK_FACTOR = 3.0
STUCK_FLOOR = 5.0  # seconds: nothing that ran for less is called stuck
USUAL_MIN_SAMPLES = 10  # timed attempts a task needs in 24 h before it has a "usual" duration
STUCK_SHOWN = 20
# Part of the dashboard -> the permission its page needs: health (pumps, hints, maintenance) is
# the Pumps page's; the queue lines the Queues page's; charts, running, stuck and failed jobs the
# Jobs list's.
SECTIONS = {"health": "backwave.view_pump", "queues": "backwave.view_queue", "jobs": "backwave.view_job"}
ALL_SECTIONS = frozenset(SECTIONS)


def sections_for(user) -> frozenset[str]:
    """The parts of the dashboard ``user`` may see (none: no dashboard at all)."""
    return frozenset(name for name, permission in SECTIONS.items() if user is not None and user.has_perm(permission))


def pick_range(value) -> str:
    return value if value in RANGES else DEFAULT_RANGE


@dataclass
class Chart:
    """A bar chart's data: one (bucket start, succeeded, failing) per bucket, oldest first, with
    every bucket of the range present (empty ones as zeros)."""

    resolution: int
    buckets: list[tuple[datetime, int, int]]

    @property
    def total_succeeded(self) -> int:
        return sum(b[1] for b in self.buckets)

    @property
    def total_failing(self) -> int:
        return sum(b[2] for b in self.buckets)


@dataclass
class Health:
    pumps_by_status: dict[str, int]
    pumps: list  # Pump rows annotated by with_shown_status, worst first
    worker_processes: int  # distinct (host, pid) with a pump that is not lost
    hint_sessions: int
    hint_since: datetime | None
    rolled_at: datetime | None
    rolled_age: timedelta | None
    behind: stats.Count
    unserved: list[UnservedQueue] = field(default_factory=list)  # due jobs no live pump serves

    @property
    def verdict(self) -> str:
        """'halted', 'lost', 'degraded', 'idle' (no pump at all) or 'healthy'. A queue whose due
        jobs no live pump serves is degraded, however healthy the pumps that run are."""
        if self.pumps_by_status.get(ShownPumpStatus.HALTED, 0):
            return "halted"
        if self.pumps_by_status.get(ShownPumpStatus.LOST, 0):
            return "lost"
        if self.unserved:
            return "degraded"
        if not self.pumps:
            return "idle"
        if self.pumps_by_status.get(ShownPumpStatus.STALE, 0) or self.pumps_by_status.get(ShownPumpStatus.DEGRADED, 0):
            return "degraded"
        if self.hint_sessions < self.worker_processes:
            return "degraded"
        return "healthy"


@dataclass
class StuckJob:
    id: int
    task_path: str
    queue: str
    worker_id: str
    attempt: int
    started_at: datetime | None
    running_for: float
    lease_lapsed: bool
    usual: float | None  # the task's p95 over 24 h

    @property
    def why(self) -> str:
        if self.lease_lapsed:
            return "its worker's lease has lapsed: maintenance will give it back"
        return f"running {STUCK_FACTOR:g}x longer than usual"


@dataclass
class Failure:
    attempt_id: int
    job_id: int
    number: int
    state: str
    error_class: str
    message: str
    finished_at: datetime
    worker_id: str
    task_path: str
    queue: str
    job_state: str


@dataclass
class QueueHealth:
    line: stats.QueueLine
    oldest_due: float | None  # seconds the oldest due ready job has waited


@dataclass
class Dashboard:
    """What the dashboard shows; the parts outside ``sections`` are None (or empty) and unread."""

    range_name: str
    range_label: str
    sections: frozenset[str]
    health: Health | None
    chart: Chart | None
    queues: list[QueueHealth]
    running: int  # running jobs read (up to RUNNING_SHOWN)
    stuck: list[StuckJob]
    failures: list[Failure]
    tail_capped: bool = False
    notes: list[str] = field(default_factory=list)


def error_message(error_class: str, traceback: str) -> str:
    """The line an operator wants: the traceback's last non-empty line (Python puts
    "ValueError: what went wrong" there), else the error class."""
    for line in reversed((traceback or "").splitlines()):
        if line.strip():
            return line.strip()
    return error_class or "(no error recorded)"


def _filled(rows, seconds: int, resolution: int, now: datetime) -> list[tuple[datetime, int, int]]:
    """Every bucket of the range, oldest first, as the statement aligns them (UTC multiples)."""
    by_start = {bucket: (int(ok), int(bad)) for bucket, ok, bad in rows}
    first = int((now.timestamp() - seconds) // resolution * resolution)
    last = int(now.timestamp() // resolution * resolution)
    buckets = []
    for start in range(first, last + 1, resolution):
        moment = datetime.fromtimestamp(start, tz=now.tzinfo)
        ok, bad = by_start.get(moment, (0, 0))
        buckets.append((moment, ok, bad))
    return buckets


def usual_durations(cursor, tasks) -> dict[str, float]:
    """Each task's p95 over the last 24 hours, for tasks with enough timed attempts."""
    if not tasks:
        return {}
    usual = {}
    for summary in summaries(operator.task_stats(cursor, seconds=86400, resolution=3600, tasks=sorted(tasks))):
        if summary.timed >= USUAL_MIN_SAMPLES and summary.p95 is not None:
            usual[summary.task_path] = summary.p95
    return usual


def summaries(rows) -> list[taskstats.TaskSummary]:
    """TaskSummary per row of operator.task_stats."""
    result = []
    for task, ok, retried, failed, quarantined, lapsed, cancelled, snoozed, reruns, timed, total, longest, histograms in rows:
        summary = taskstats.TaskSummary(task_path=task)
        summary.add(
            succeeded=ok,
            retried=retried,
            failed=failed,
            quarantined=quarantined,
            lapsed=lapsed,
            cancelled=cancelled,
            snoozed=snoozed,
            reruns=reruns,
            timed=timed,
            duration_sum=total or 0.0,
            duration_max=longest or 0.0,
            histogram=taskstats.merge_histograms(json.loads(h) if isinstance(h, str) else h for h in histograms or ()),
        )
        result.append(summary)
    return result


def build(range_name: str, using: str = "default", sections: frozenset[str] = ALL_SECTIONS) -> Dashboard:
    """Everything the dashboard shows of ``sections``, in a fixed number of queries (pinned by
    the tests); a part left out costs no query."""
    with stats.without_jit(using):
        return _build(pick_range(range_name), using, sections)


def _build(range_name: str, using: str, sections: frozenset[str]) -> Dashboard:
    seconds, resolution, label = RANGES[range_name]
    board = Dashboard(
        range_name=range_name,
        range_label=label,
        sections=sections,
        health=None,
        chart=None,
        queues=[],
        running=0,
        stuck=[],
        failures=[],
    )
    pumps = []
    if "health" in sections:
        pumps = list(Pump.objects.using(using).with_shown_status().order_by("rank", "group", "worker_id"))
    # The verdict and the queue rows both say which queues no live pump serves.
    unserved = stats.unserved_queues(using) if sections & {"health", "queues"} else []
    lines = stats.queue_lines(stats.table_statistics(using), using, unserved=unserved) if "queues" in sections else []
    if len(console_databases()) > 1:
        lines = stats.lines_living_in(lines, using)
    with connections[using].cursor() as cursor:
        if "health" in sections:
            listeners, listening_since, _newest = operator.hint_sessions(cursor)
        _watermark, rolled_at, rolled_age, behind, now = operator.rollup_status(cursor, limit=BEHIND_CAP + 1)
        if "jobs" in sections:
            series = operator.stats_series(cursor, seconds=seconds, resolution=resolution, tail=TAIL_CAP)
        if "queues" in sections:
            latency = operator.queue_latency(cursor, [line.name for line in lines])
            board.queues = [QueueHealth(line=line, oldest_due=latency.get(line.name)) for line in lines]
        if "jobs" in sections:
            running = operator.running_jobs(cursor, limit=RUNNING_SHOWN)
            usual = usual_durations(cursor, {row[1] for row in running})
            failures = operator.recent_failures(cursor, limit=FAILURES_SHOWN)
    if "health" in sections:
        by_status = {status: 0 for status in ShownPumpStatus.values}
        for pump in pumps:
            by_status[pump.shown_status] += 1
        processes = {(p.hostname, p.pid) for p in pumps if p.shown_status not in (ShownPumpStatus.LOST, ShownPumpStatus.HALTED)}
        board.health = Health(
            pumps_by_status=by_status,
            pumps=pumps,
            worker_processes=len(processes),
            hint_sessions=listeners,
            hint_since=listening_since,
            rolled_at=rolled_at,
            rolled_age=rolled_age,
            behind=stats.Count(BEHIND_CAP, capped=True) if behind > BEHIND_CAP else stats.Count(behind),
            unserved=unserved,
        )
    if "jobs" in sections:
        board.chart = Chart(resolution=resolution, buckets=_filled(series, seconds, resolution, now))
        board.running = len(running)
        board.stuck = _stuck(running, usual)[:STUCK_SHOWN]
        board.failures = [
            Failure(
                attempt_id=attempt_id,
                job_id=job_id,
                number=number,
                state=state,
                error_class=error_class,
                message=error_message(error_class, traceback),
                finished_at=finished_at,
                worker_id=worker,
                task_path=task,
                queue=queue,
                job_state=job_state,
            )
            for attempt_id, job_id, number, state, error_class, traceback, finished_at, worker, task, queue, job_state in failures
        ]
        board.tail_capped = behind > TAIL_CAP
    return board


def _stuck(running, usual: dict[str, float]) -> list[StuckJob]:
    stuck = []
    for job_id, task, queue, worker, attempt, started, running_for, _expires, lapsed in running:
        threshold = max(STUCK_FACTOR * usual[task], STUCK_FLOOR) if task in usual else None
        if lapsed or (threshold is not None and running_for > threshold):
            stuck.append(
                StuckJob(
                    id=job_id,
                    task_path=task,
                    queue=queue,
                    worker_id=worker,
                    attempt=attempt,
                    started_at=started,
                    running_for=running_for,
                    lease_lapsed=lapsed,
                    usual=usual.get(task),
                )
            )
    return stuck

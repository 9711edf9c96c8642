"""The admin's read side: queue depths, throughput and row counts that stay cheap at any size.

Every number here is read through an index whose size is bounded by work that is still to be
done, or is bounded by a cap, or comes from the planner's statistics; none is a ``COUNT(*)`` over
the whole job table:

* **Depths** (ready, scheduled, running, failed, quarantined, waiting, held per queue): one
  statement, a bounded count per (queue, state), each an index scan that stops after
  ``COUNT_CAP + 1`` rows. Ready and scheduled rows are counted in the claim index (queue
  leading), failed and quarantined ones in the partial ``backwave_job_failed_queue`` index,
  waiting and held ones (a workflow's jobs held back) in the partial ``backwave_job_waiting_held``
  index, running ones through the running-jobs index (as many rows as jobs in flight). A count
  that reaches the cap shows as "10,000+", with the planner's estimate beside it.
* **Queue names**: the Queue rows, the settings, and the queues that have ready, running, failed,
  quarantined, waiting or held jobs, found by a loose index scan (one index probe per distinct
  queue), plus the most common values the planner keeps for ``queue``.
* **Throughput**: outcomes per minute over the last hour, read backwards from the partial
  finished-state index, at most ``THROUGHPUT_CAP`` rows per state; an hour busier than that is
  drawn for the minutes those rows cover.
* **Changelist counts**: ``EstimatedCountPaginator`` counts up to ``COUNT_CAP + 1`` rows of the
  filtered query, and past that asks the planner (``EXPLAIN``) how many rows it expects.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property

from contextlib import contextmanager

from django.core.paginator import Paginator
from django.db import connections, transaction
from django.db.models import QuerySet

from .. import conf
from ..core.health import UnservedQueue
from ..store import operator

COUNT_CAP = 10_000
THROUGHPUT_CAP = 50_000  # rows read per finished state for the last hour's sparkline
THROUGHPUT_MINUTES = 60
COUNTED_STATES = ("ready", "scheduled", "running", "failed", "quarantined")
# The Queues page (and the dashboard's lines) also count the workflow jobs held back; the metrics
# view counts COUNTED_STATES.
QUEUE_LINE_STATES = (*COUNTED_STATES, "waiting", "held")


@dataclass(frozen=True, slots=True)
class Count:
    """A bounded count: exact up to the cap; past it, ``at_least`` plus the planner's estimate."""

    value: int
    capped: bool = False
    estimate: int | None = None

    def __str__(self):
        if not self.capped:
            return f"{self.value:,}"
        return f"{self.value:,}+"


@dataclass(frozen=True, slots=True)
class TableStatistics:
    """What the planner knows about backwave_job: its row count and most common values."""

    rows: int | None  # None: never analyzed
    columns: dict = field(default_factory=dict)  # column -> (null_frac, n_distinct, {value: freq})
    queue_rows: tuple[str, ...] = ()  # names of the Queue rows (read in the same statement)

    def common_values(self, column: str) -> list[str]:
        return sorted(self.columns.get(column, (0, 0, {}))[2])

    def fraction(self, column: str, value: str) -> float | None:
        """The planner's selectivity of ``column = value`` (None without statistics)."""
        if column not in self.columns or not self.rows:
            return None
        null_frac, n_distinct, common = self.columns[column]
        if value in common:
            return common[value]
        distinct = -n_distinct * self.rows if n_distinct < 0 else n_distinct
        rest = max(1.0 - null_frac - sum(common.values()), 0.0)
        return rest / max(distinct - len(common), 1)

    def estimate(self, **equalities) -> int | None:
        """Rows matching every ``column=value``, assuming independence as the planner does."""
        if not self.rows:
            return None
        total = float(self.rows)
        for column, value in equalities.items():
            share = self.fraction(column, value)
            if share is None:
                return None
            total *= share
        return int(round(total))


@contextmanager
def without_jit(using: str = "default"):
    """Run the block's statements in one transaction with PostgreSQL's JIT off (set locally:
    it ends with the transaction, or is put back when the block ran inside one).

    The bounded counts (``LIMIT cap + 1`` per queue and state) make the planner's cost estimate
    of a page's statements large, though they read little; past ``jit_above_cost`` the server
    then compiles them first. Measured at 1,000,000 jobs: the queue overview ran in 52 ms and
    spent 1.7 s more in JIT compilation, on every load of the Queues page and the dashboard."""
    connection = connections[using]
    enclosed = connection.in_atomic_block  # ATOMIC_REQUESTS, or a caller's transaction: put it back after
    with transaction.atomic(using=using), connection.cursor() as cursor:
        # Read before set: a target list is evaluated in order.
        cursor.execute("SELECT current_setting('jit'), set_config('jit', 'off', true)")
        previous = cursor.fetchone()[0]
        try:
            yield
        finally:
            if enclosed:
                cursor.execute("SELECT set_config('jit', %s, true)", [previous])


def table_statistics(using: str = "default") -> TableStatistics:
    """One query: the planner's statistics of backwave_job, and the Queue rows' names."""
    with connections[using].cursor() as cursor:
        rows = operator.table_statistics(cursor)
    reltuples = rows[0][0] if rows else -1
    columns = {}
    for _rows, attname, null_frac, n_distinct, values, freqs, _names in rows:
        if attname is not None:
            columns[attname] = (null_frac or 0.0, n_distinct or 0.0, dict(zip(values or (), freqs or (), strict=False)))
    return TableStatistics(
        rows=int(reltuples) if reltuples is not None and reltuples >= 0 else None,
        columns=columns,
        queue_rows=tuple(rows[0][6]) if rows else (),
    )


@dataclass
class QueueLine:
    """One line of the Queues page."""

    name: str
    has_row: bool
    concurrency_limit: int | None
    paused: bool
    counts: dict[str, Count]
    per_minute: list[int] = field(default_factory=list)  # oldest minute first
    # Admission (BACKWAVE["QUEUES"]): running jobs per limit key, starts per rate period.
    key_concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    key_rate_limit: int | None = None
    unserved: UnservedQueue | None = None  # a due job, and no live pump serves the queue

    @property
    def rate_shown(self) -> str:
        """The rate limits as "50 / 1 s", "5 / 1 s per key", both, or "" without one."""
        parts = []
        if self.rate_limit is not None:
            parts.append(f"{self.rate_limit:,} / {self.rate_period:g} s")
        if self.key_rate_limit is not None:
            parts.append(f"{self.key_rate_limit:,} / {self.rate_period:g} s per key")
        return ", ".join(parts)

    @property
    def finished_last_hour(self) -> int:
        return sum(self.per_minute)


def queue_lines(
    statistics: TableStatistics, using: str = "default", cap: int | None = None, unserved: list[UnservedQueue] = ()
) -> list[QueueLine]:
    """One query: a line per known queue with its bounded depths, limit and pause flag; a queue of
    ``unserved`` (unserved_queues) has its line, known otherwise or not, and says so."""
    cap = COUNT_CAP if cap is None else cap
    by_name = {queue.name: queue for queue in unserved}
    extra = sorted(conf.configured_queue_names() | set(statistics.common_values("queue")) | set(by_name))
    with connections[using].cursor() as cursor:
        rows = operator.queue_overview(cursor, names=extra, limit=cap + 1)
    lines = []
    for name, has_row, limit, paused, *numbers, key_limit, rate_limit, rate_period, key_rate_limit in rows:
        counts = {}
        for state, number in zip(QUEUE_LINE_STATES, numbers, strict=True):
            if number > cap:
                db_state = "ready" if state == "scheduled" else state
                counts[state] = Count(cap, capped=True, estimate=statistics.estimate(state=db_state, queue=name))
            else:
                counts[state] = Count(number)
        lines.append(
            QueueLine(
                name=name,
                has_row=has_row,
                concurrency_limit=limit,
                paused=paused,
                counts=counts,
                key_concurrency_limit=key_limit,
                rate_limit=rate_limit,
                rate_period=rate_period,
                key_rate_limit=key_rate_limit,
                unserved=by_name.get(name),
            )
        )
    return lines


def lines_living_in(lines: list[QueueLine], using: str) -> list[QueueLine]:
    """Those of ``lines`` (read from ``using``) whose queue lives there (a backend of that
    database declares it, ``backwave.databases.queue_databases``), or that have a row or jobs
    there: with several databases, a queue another database holds is no line of this one."""
    from ..databases import backwave_backends, queue_databases

    backends = backwave_backends()
    return [
        line
        for line in lines
        if line.has_row or any(count.value for count in line.counts.values()) or using in queue_databases(line.name, backends)
    ]


def unserved_queues(using: str = "default") -> list[UnservedQueue]:
    """One query: the queues of ``using`` with a due job and no live pump serving them."""
    with connections[using].cursor() as cursor:
        return [UnservedQueue(name, due_for, using) for name, due_for in operator.unserved_queues(cursor)]


@dataclass(frozen=True, slots=True)
class Throughput:
    per_queue: dict[str, list[int]]  # queue -> outcomes per minute, oldest minute first
    covered_minutes: int  # THROUGHPUT_MINUTES, or fewer when the hour was too busy to read whole


def throughput(using: str = "default", cap: int | None = None) -> Throughput:
    """One query: outcomes per queue and minute over the last hour."""
    cap = THROUGHPUT_CAP if cap is None else cap
    with connections[using].cursor() as cursor:
        rows = operator.throughput(cursor, minutes=THROUGHPUT_MINUTES, limit=cap)
    covered = THROUGHPUT_MINUTES
    per_queue: dict[str, list[int]] = {}
    for queue, minutes_ago, number, covered_minutes in rows:
        if covered_minutes is not None:
            covered = min(covered, covered_minutes)
        if 0 <= minutes_ago < THROUGHPUT_MINUTES:
            per_queue.setdefault(queue, [0] * THROUGHPUT_MINUTES)[THROUGHPUT_MINUTES - 1 - minutes_ago] += number
    return Throughput(per_queue=per_queue, covered_minutes=covered)


def planner_rows(queryset: QuerySet) -> int | None:
    """The planner's estimate of how many rows ``queryset`` returns (one EXPLAIN, no execution)."""
    try:
        plan = json.loads(queryset.order_by().explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts past ``cap + 1`` rows.

    Up to the cap the count is exact. Past it the planner's estimate stands in (never less than
    ``cap + 1``) and ``estimated`` is True, so the page can say "about". One bounded
    ``SELECT count(*) FROM (... LIMIT cap + 1)``, plus one EXPLAIN when the cap is reached.
    """

    cap = COUNT_CAP
    estimated = False

    @cached_property
    def count(self):
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        bounded = queryset.order_by()[: self.cap + 1].count()
        if bounded <= self.cap:
            return bounded
        self.estimated = True
        estimate = planner_rows(queryset)
        return max(self.cap + 1, estimate or 0)


def sparkline_points(values: list[int], width: float, height: float, pad: float = 1.5) -> str:
    """SVG polyline points for ``values`` scaled into a width x height box."""
    if not values:
        return ""
    top = max(values) or 1
    step = (width - 2 * pad) / max(len(values) - 1, 1)
    points = []
    for i, value in enumerate(values):
        x = pad + i * step
        y = height - pad - (height - 2 * pad) * value / top
        points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points)


def humanize_estimate(number: int | None) -> str:
    """1234567 -> '1.2M', 45678 -> '46k'."""
    if number is None:
        return "?"
    if number >= 1_000_000:
        return f"{number / 1_000_000:.1f}M"
    if number >= 10_000:
        return f"{math.floor(number / 1000 + 0.5):,}k"
    return f"{number:,}"

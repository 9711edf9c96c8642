"""The worker's Prometheus metrics: what this process did and how its pumps are.

Counting costs the pump thread no lock: each pump keeps a ``PumpTally`` that only its own thread
writes (plain ints in plain dicts, bumped as the store applies each outcome of a batch), and it
publishes an immutable ``TallySnapshot`` of it when it publishes its ``PumpSnapshot`` (about to
wait, or every 64 events while busy), and only when something changed. A scrape, on the health
server's thread, reads those snapshots and builds the metric families then (a custom collector):
no prometheus_client ``Counter.inc`` or ``Histogram.observe``, each of which takes a lock, runs
per job. So a scrape can be up to one publication behind the pump, never inconsistent (a
histogram's buckets, sum and count always come from one snapshot).

The database's view (jobs by queue and state, queue latency, pumps of the whole cluster) is the
Django view's (``backwave.metrics``): every worker exporting it would repeat the same series once
per process, and this endpoint must answer while the database does not.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from backwave.core.health import DEGRADED, HALTED, HEALTHY
from backwave.core.jobs import OutcomeKind

# prometheus_client is imported by the first scrape, not here: the pumps import this module for
# their tallies, and loading the client (its exposition and HTTP modules) put 11 ms of the
# 0.1-0.15 s between django.setup() and a worker's first claim, for an endpoint that may never
# be scraped.
if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .worker import Worker

# Seconds: from a no-op (a few ms) to the hour a report may take.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
PUMP_STATUSES = (HEALTHY, DEGRADED, HALTED)
OUTCOME_LABELS = {kind: kind.value for kind in OutcomeKind}


class TallySnapshot(NamedTuple):
    """A pump's counts since it started, as published (never changed afterwards)."""

    finished: dict  # (queue, task, outcome) -> jobs whose outcome the store applied
    durations: dict  # (queue, task) -> (per-bucket counts, the last one +Inf; sum of seconds)
    lease_expired_jobs: int  # jobs this pump's maintenance released from lapsed leases (anyone's)
    leases_lost: int  # times this pump gave its own lease up (expired elsewhere, or self-fenced)


EMPTY_TALLY = TallySnapshot({}, {}, 0, 0)


class PumpTally:
    """A pump's counts, written by its thread alone; ``publish()`` hands out a copy."""

    __slots__ = ("_finished", "_buckets", "_sums", "lease_expired_jobs", "leases_lost", "_dirty", "_published")

    def __init__(self):
        self._finished: dict[tuple[str, str, str], int] = {}
        self._buckets: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = {}
        self.lease_expired_jobs = 0
        self.leases_lost = 0
        self._dirty = False
        self._published = EMPTY_TALLY

    def applied(self, queue: str, task: str, kind: OutcomeKind, duration: float) -> None:
        """One outcome the store applied (the kind it stored); its duration when the task ran."""
        key = (queue, task, OUTCOME_LABELS[kind])
        self._finished[key] = self._finished.get(key, 0) + 1
        if kind is not OutcomeKind.QUARANTINED:  # an unroutable job never ran: no duration
            where = (queue, task)
            buckets = self._buckets.get(where)
            if buckets is None:
                buckets = self._buckets[where] = [0] * (len(DURATION_BUCKETS) + 1)
                self._sums[where] = 0.0
            buckets[bisect_left(DURATION_BUCKETS, duration)] += 1  # le: a bucket holds its bound
            self._sums[where] += duration
        self._dirty = True

    def expired(self, jobs: int) -> None:
        if jobs:
            self.lease_expired_jobs += jobs
            self._dirty = True

    def lost_lease(self) -> None:
        self.leases_lost += 1
        self._dirty = True

    def publish(self) -> TallySnapshot:
        """The counts as they are now: a new snapshot only when something changed since the last."""
        if self._dirty:
            self._published = TallySnapshot(
                dict(self._finished),
                {where: (tuple(buckets), self._sums[where]) for where, buckets in self._buckets.items()},
                self.lease_expired_jobs,
                self.leases_lost,
            )
            self._dirty = False
        return self._published


class WorkerCollector:
    """The metric families of one worker process, built from what its pumps published."""

    def __init__(self, worker: Worker):
        self._worker = worker

    def collect(self) -> Iterable:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        worker = self._worker
        finished = CounterMetricFamily(
            "backwave_jobs_finished",
            "Attempts whose outcome this worker wrote, by the outcome stored.",
            labels=("database", "queue", "task", "outcome"),
        )
        durations = HistogramMetricFamily(
            "backwave_job_duration_seconds",
            "How long attempts ran in this worker (quarantined jobs, which never run, left out).",
            labels=("database", "queue", "task"),
        )
        pumps = GaugeMetricFamily(
            "backwave_worker_pumps", "This worker's pumps by status.", labels=("database", "group", "status")
        )
        stalled = GaugeMetricFamily(
            "backwave_worker_pumps_stalled",
            "This worker's pumps none of whose store calls completed for longer than their lease.",
            labels=("database", "group"),
        )
        running = GaugeMetricFamily("backwave_jobs_running", "Attempts running in this worker now.", labels=("database", "group"))
        claimed_ahead = GaugeMetricFamily(
            "backwave_jobs_claimed_ahead",
            "Jobs this worker claimed ahead, waiting for a thread: running in the database, not started yet.",
            labels=("database", "group"),
        )
        expired = CounterMetricFamily(
            "backwave_lease_expired_jobs",
            "Jobs this worker's maintenance released from lapsed leases (any worker's).",
            labels=("database",),
        )
        lost = CounterMetricFamily(
            "backwave_leases_lost",
            "Times a pump of this worker gave its lease up (expired elsewhere, or not renewed in time).",
            labels=("database", "group"),
        )
        abandoned = CounterMetricFamily(
            "backwave_attempts_abandoned",
            "Attempts this worker gave up on (a lost lease, a drain deadline): they run again elsewhere.",
            labels=("database", "group"),
        )
        round_trips = CounterMetricFamily(
            "backwave_store_round_trips", "Store round-trips of this worker's pumps.", labels=("database", "group")
        )
        hints = CounterMetricFamily(
            "backwave_wake_up_hints_received", "Wake-up hints (NOTIFY) this worker received.", labels=("database",)
        )

        totals: dict[tuple, int] = {}
        histograms: dict[tuple, list] = {}
        expired_by_database: dict[str, int] = {}
        by_group: dict[tuple[str, str], dict] = {}
        for pump in worker.pumps:
            database, group = pump.options.database, pump.options.name
            tally, snapshot = pump.tally_snapshot, pump.snapshot
            for (queue, task, outcome), count in tally.finished.items():
                key = (database, queue, task, outcome)
                totals[key] = totals.get(key, 0) + count
            for (queue, task), (counts, seconds) in tally.durations.items():
                into = histograms.setdefault((database, queue, task), [[0] * len(counts), 0.0])
                into[0] = [a + b for a, b in zip(into[0], counts, strict=True)]
                into[1] += seconds
            expired_by_database[database] = expired_by_database.get(database, 0) + tally.lease_expired_jobs
            line = by_group.setdefault(
                (database, group), dict.fromkeys((*PUMP_STATUSES, "stalled", "running", "ahead", "lost", "abandoned", "trips"), 0)
            )
            line[pump.health] += 1
            line["stalled"] += pump.stalled
            line["running"] += snapshot.executing
            line["ahead"] += snapshot.claimed_ahead
            line["lost"] += tally.leases_lost
            line["abandoned"] += snapshot.abandoned
            line["trips"] += pump.round_trips

        for labels, count in sorted(totals.items()):
            finished.add_metric(labels, count)
        bounds = [floatToGoString(bound) for bound in DURATION_BUCKETS] + ["+Inf"]
        for labels, (counts, seconds) in sorted(histograms.items()):
            cumulative, running_total = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                running_total += count
                cumulative.append((bound, running_total))
            durations.add_metric(labels, cumulative, seconds)
        for (database, group), line in sorted(by_group.items()):
            for status in PUMP_STATUSES:
                pumps.add_metric((database, group, status), line[status])
            stalled.add_metric((database, group), line["stalled"])
            running.add_metric((database, group), line["running"])
            claimed_ahead.add_metric((database, group), line["ahead"])
            lost.add_metric((database, group), line["lost"])
            abandoned.add_metric((database, group), line["abandoned"])
            round_trips.add_metric((database, group), line["trips"])
        for database, count in sorted(expired_by_database.items()):
            expired.add_metric((database,), count)
        for database, listener in sorted(worker.hints.items()):
            hints.add_metric((database,), listener.hints_received)
        yield from (finished, durations, pumps, stalled, running, claimed_ahead, expired, lost, abandoned, round_trips, hints)


class _Registries:
    """Several registries read as one: the worker's own, then the process-wide default (the
    process and Python collectors, and whatever metrics the project's own code registers)."""

    def __init__(self, registries: Iterable):
        self._registries = tuple(registries)

    def collect(self):
        for registry in self._registries:
            yield from registry.collect()


def worker_registry(worker: Worker) -> CollectorRegistry:
    """A registry holding only this worker's collector (one per Worker, so several in one
    process, as in tests, never collide)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    return registry


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The body and content type of a scrape: OpenMetrics when the scraper asks for it, else
    Prometheus's text format; the default registry's metrics follow the worker's."""
    from prometheus_client import REGISTRY
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept or "")
    return encoder(_Registries((registry, REGISTRY))), content_type

"""The Django metrics view: the database's side of BackWave in Prometheus's format.

A worker's own ``/metrics`` (``backwave/shell/metrics.py``) counts what that process did; this
view reports what the database says about the whole cluster, once, however many workers run:
jobs by queue and state, the age of each queue's oldest due job, pumps by the status the admin
shows (their lease judged by the database clock), and leases that lapsed without being released
yet. Every number comes from a bounded statement (``metrics_queues`` in queries.sql: index
probes and capped index ranges, never a scan of the backlog, run without JIT compilation):
six statements per database at any table size (BEGIN, JIT off, queues, COMMIT, pumps, lapsed
leases), seven when a depth passes ``COUNT_CAP`` (the planner's statistics then give the
estimate reported).

Who may read it: a scraper sending ``Authorization: Bearer <BACKWAVE["METRICS_TOKEN"]>``
(compared in constant time), or a signed-in, active staff user with ``backwave.view_job`` (the
permission that shows the same jobs in the admin). Prometheus cannot sign in to a Django session,
and a token in the scrape configuration is what its ``authorization`` block sends; the staff rule
lets an operator open it in a browser without a second secret. Anything else: 401 (with
``WWW-Authenticate: Bearer``) or 403, and no query runs.
"""

from __future__ import annotations

import hmac
from collections import Counter

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily

from .. import conf
from ..models import Pump, ShownPumpStatus
from ..store import operator
from .stats import COUNT_CAP, COUNTED_STATES, table_statistics

SHOWN_STATUSES = tuple(status.value for status in ShownPumpStatus)


def served_databases() -> list[str]:
    """The databases BackWave's backends enqueue into, in TASKS order (``default`` when none)."""
    from ..databases import backwave_backends

    return list(dict.fromkeys(backend.database for backend in backwave_backends())) or [DEFAULT_DB_ALIAS]


class DatabaseCollector:
    """The cluster's metric families, read from each database when collected."""

    def __init__(self, databases: list[str]):
        self._databases = databases

    def collect(self):
        jobs = GaugeMetricFamily(
            "backwave_jobs",
            f"Jobs by queue and state (ready: due now; scheduled: ready, due later); exact up to {COUNT_CAP:,}, the planner's estimate past that.",
            labels=("database", "queue", "state"),
        )
        paused = GaugeMetricFamily("backwave_queue_paused", "1 while the queue is paused.", labels=("database", "queue"))
        latency = GaugeMetricFamily(
            "backwave_queue_oldest_job_age_seconds",
            "How long the queue's oldest due ready job has waited since it became due (0 when none is due).",
            labels=("database", "queue"),
        )
        pumps = GaugeMetricFamily(
            "backwave_pumps",
            "Pumps by the status the admin shows (lost: no live lease; stale: no heartbeat for a whole lease).",
            labels=("database", "group", "status"),
        )
        lapsed = GaugeMetricFamily(
            "backwave_leases_lapsed", "Leases past their expiry that maintenance has not released yet.", labels=("database",)
        )
        stranded = GaugeMetricFamily(
            "backwave_jobs_under_lapsed_leases",
            "Running jobs under a lapsed lease: they run again once maintenance releases them.",
            labels=("database",),
        )
        for alias in self._databases:
            self._collect_queues(alias, jobs, paused, latency)
            counts = Counter(Pump.objects.using(alias).with_shown_status().values_list("group", "shown_status"))
            for group in sorted({group for group, _ in counts}):
                for status in SHOWN_STATUSES:
                    pumps.add_metric((alias, group, status), counts[(group, status)])
            with connections[alias].cursor() as cursor:
                leases, running = operator.lapsed_leases(cursor)
            lapsed.add_metric((alias,), leases)
            stranded.add_metric((alias,), running)
        yield from (jobs, paused, latency, pumps, lapsed, stranded)

    @staticmethod
    def _collect_queues(alias, jobs, paused, latency) -> None:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            operator.metrics_without_jit(cursor)
            rows = operator.metrics_queues(cursor, names=sorted(conf.configured_queue_names()), limit=COUNT_CAP + 1)
        statistics = None
        if any(number > COUNT_CAP for row in rows for number in row[2:7]):
            statistics = table_statistics(alias)  # for the estimates of the depths past the cap
        for name, is_paused, *depths, oldest_age in rows:
            for state, number in zip(COUNTED_STATES, depths, strict=True):
                if number > COUNT_CAP:
                    # Past the cap the planner's estimate (never below what was counted) stands in.
                    estimate = statistics.estimate(state="ready" if state == "scheduled" else state, queue=name)
                    number = max(number, estimate or 0)
                jobs.add_metric((alias, name, state), number)
            paused.add_metric((alias, name), int(is_paused))
            latency.add_metric((alias, name), oldest_age or 0.0)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read the metrics (a 401 or 403 response), or None when it may."""
    token = conf.get_setting("METRICS_TOKEN")
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, credentials = header.partition(" ")
        if token and scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode()):
            return None
        return _unauthorized("invalid_token" if scheme.lower() == "bearer" else "invalid_request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return _unauthorized(None)
    if user.is_active and user.is_staff and user.has_perm("backwave.view_job"):
        return None
    return HttpResponse(
        "Reading BackWave's metrics needs the backwave.view_job permission (and staff status).\n",
        status=403,
        content_type="text/plain",
    )


def _unauthorized(error: str | None) -> HttpResponse:
    response = HttpResponse(
        "BackWave's metrics need Authorization: Bearer <BACKWAVE['METRICS_TOKEN']>, or a staff user's session.\n",
        status=401,
        content_type="text/plain",
    )
    response["WWW-Authenticate"] = 'Bearer realm="backwave"' + (f', error="{error}"' if error else "")
    return response


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The cluster's metrics for Prometheus (OpenMetrics when the scraper asks for it)."""
    if (refusal := _refusal(request)) is not None:
        return refusal
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(served_databases()))
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)

"""The Task statistics page: per task over a chosen range, attempts by outcome, failure rate,
retries run, and p50 / p95 / max duration, read from the rollup maintenance keeps
(``roll_up_task_stats``), never from the job table: two queries whatever the table's size."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ..models import TaskStat
from ..store import operator
from .common import EngineRows
from .databases import selected_database

# name -> (seconds, bucket resolution, label)
RANGES = {
    "1h": (3600, 60, "the last hour"),
    "24h": (86400, 3600, "the last 24 hours"),
    "7d": (7 * 86400, 3600, "the last 7 days"),
}
DEFAULT_RANGE = "24h"
SORTS = {
    "attempts": lambda s: (-s.attempts, s.task_path),
    "failure": lambda s: (-(s.failure_rate or 0), -s.attempts, s.task_path),
    "p95": lambda s: (-(s.p95 or 0), s.task_path),
    "task": lambda s: s.task_path,
}


@admin.register(TaskStat)
class TaskStatAdmin(EngineRows, admin.ModelAdmin):
    """One line per task that finished an attempt in the range; the rows themselves (one per task
    and bucket) are the engine's and have no page of their own."""

    def get_urls(self):
        return [path("", self.admin_site.admin_view(self.changelist_view), name="backwave_taskstat_changelist")]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        chosen = request.GET.get("range")
        chosen = chosen if chosen in RANGES else DEFAULT_RANGE
        sort = request.GET.get("sort")
        sort = sort if sort in SORTS else "attempts"
        seconds, resolution, label = RANGES[chosen]
        # Here, not at the top: every process imports this module at django.setup() (admin
        # autodiscovery), a worker too, and the dashboard is this page's and the index's alone.
        from . import dashboard

        with connections[selected_database(request)].cursor() as cursor:
            summaries = dashboard.summaries(operator.task_stats(cursor, seconds=seconds, resolution=resolution))
            _watermark, rolled_at, rolled_age, behind, _now = operator.rollup_status(cursor, limit=dashboard.BEHIND_CAP + 1)
        summaries.sort(key=SORTS[sort])
        context = {
            **self.admin_site.each_context(request),
            "title": "Task statistics",
            "subtitle": None,
            "opts": self.opts,
            "summaries": summaries,
            "ranges": [(name, text) for name, (_s, _r, text) in RANGES.items()],
            "range_name": chosen,
            "range_label": label,
            "sort": sort,
            "rolled_at": rolled_at,
            "rolled_age": rolled_age,
            "behind": behind,
            "behind_capped": behind > dashboard.BEHIND_CAP,
            "jobs_url": reverse("admin:backwave_job_changelist", current_app=self.admin_site.name),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/backwave/taskstat/overview.html", context)

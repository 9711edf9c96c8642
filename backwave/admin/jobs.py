"""The Jobs page: filters that never scan the job table, search by id or task path, every
attempt on the detail page, and the retry and cancel actions."""

from __future__ import annotations

import json
from functools import cache

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from .. import conf
from ..models import Attempt, Job, JobState
from . import actions, stats
from .common import BOTH_LOCATIONS, BigintIds, EngineRows, RefuseUnpermittedActions, parse_row_id, seconds_shown, timestamp

GONE_SHOWN = 10  # ids listed in the "no longer exists" message before "and N more"
RUNNING_REFUSAL = "{n} job{s} {are} running under a worker's lease and {were} left alone: try again once {they} finish{es}."


def _plural(n: int) -> dict:
    one = n == 1
    return {"n": n, "s": "" if one else "s", "are": "is" if one else "are", "were": "was" if one else "were",
            "they": "it" if one else "they", "es": "es" if one else ""}


def report_job_action(request, result: actions.JobActionResult, *, done: str, allowed: str) -> None:
    """Tell the operator what an action changed and why it left the rest alone."""
    changed = len(result.changed)
    if changed:
        messages.success(request, f"{done.capitalize()} {changed} job{'' if changed == 1 else 's'}.")
    if result.refused_running:
        messages.warning(request, RUNNING_REFUSAL.format(**_plural(result.refused_running)))
    others = {state: n for state, n in result.refused.items() if state != "running"}
    if others:
        listed = ", ".join(f"{n} {state}" for state, n in sorted(others.items()))
        messages.warning(request, f"Only {allowed} jobs can be {done}; left alone: {listed}.")
    if result.gone:
        shown = ", ".join(map(str, result.gone[:GONE_SHOWN])) + (f" and {len(result.gone) - GONE_SHOWN} more" if len(result.gone) > GONE_SHOWN else "")
        one = len(result.gone) == 1
        messages.warning(request, f"Job{'' if one else 's'} {shown} no longer exist{'s' if one else ''} (deleted since the page was loaded, e.g. by the retention purge).")
    if not changed and not result.refused and not result.gone:
        messages.warning(request, "No such job.")


class _StatisticsMixin:
    """One read of the planner's statistics per request, shared by the filters."""

    @staticmethod
    def statistics(request) -> stats.TableStatistics:
        statistics = getattr(request, "_backwave_statistics", None)
        if statistics is None:
            statistics = request._backwave_statistics = stats.table_statistics()
        return statistics


class JobStateFilter(admin.SimpleListFilter):
    """State, with ready split into due now and scheduled for later (no query for its choices)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("ready", "Ready (due)"), ("scheduled", "Scheduled (later)"), *[(v, l) for v, l in JobState.choices if v != "ready"]]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "ready":
            return queryset.filter(state="ready", run_at__lte=Now())
        if value == "scheduled":
            return queryset.filter(state="ready", run_at__gt=Now())
        if value in JobState.values:
            return queryset.filter(state=value)
        return queryset


class QueueFilter(_StatisticsMixin, admin.SimpleListFilter):
    """Queues from settings, Queue rows and the planner's common values: never a DISTINCT scan."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        statistics = self.statistics(request)
        names = conf.configured_queue_names() | set(statistics.queue_rows) | set(statistics.common_values("queue"))
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


@cache
def _registered_task_paths() -> tuple[str, ...]:
    """Wire names of the tasks the worker would find (imported once per process)."""
    from ..tasking.registry import TaskRegistry

    try:
        return tuple(sorted(TaskRegistry.discover(conf.get_setting("TASK_MODULES"))))
    except Exception:  # a broken tasks module must not take the admin down; the worker reports it
        return ()


class TaskFilter(_StatisticsMixin, admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request, model_admin):
        paths = set(_registered_task_paths()) | set(self.statistics(request).common_values("task_path"))
        if self.value():
            paths.add(self.value())
        return [(p, p.rsplit(".", 1)[-1] + f" ({p.rsplit('.', 1)[0]})" if "." in p else p) for p in sorted(paths)]

    def queryset(self, request, queryset):
        return queryset.filter(task_path=self.value()) if self.value() else queryset


@admin.register(Job)
class JobAdmin(EngineRows, RefuseUnpermittedActions, BigintIds, admin.ModelAdmin):
    changelist_title = "Jobs"
    list_display = ("id", "task_name", "queue", "state_badge", "attempts_shown", "enqueued", "run_at_shown", "finished")
    list_display_links = ("id", "task_name")
    list_filter = (JobStateFilter, QueueFilter, TaskFilter)
    search_fields = ("task_path",)
    search_help_text = "A job id, or part of a task's import path."
    ordering = ("-id",)
    list_per_page = 50
    paginator = stats.EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_now", "cancel"]
    fieldsets = [
        (None, {"fields": [("task_path", "queue", "state"), ("priority", "backend", "tags", "schedule_link")]}),
        ("Timing (database clock)", {"fields": [("enqueued", "run_at_shown", "started", "last_attempted", "finished")]}),
        ("Retries and lease", {"fields": [("attempts", "max_attempts", "worker_id"), ("backoff_base", "backoff_max", "lease_id")]}),
        ("Admission", {"fields": [("unique_key_shown", "unique_states_shown", "limit_key_shown")]}),
        ("Payload and result", {"fields": [("payload_json", "return_value_json")]}),
    ]
    readonly_fields = (
        "task_path", "queue", "state", "priority", "tags", "backend", "schedule_link", "enqueued", "run_at_shown",
        "started", "last_attempted", "finished", "attempts", "max_attempts", "backoff_base", "backoff_max",
        "worker_id", "lease_id", "payload_json", "return_value_json",
        "unique_key_shown", "unique_states_shown", "limit_key_shown",
    )

    # --- permissions: the rows are the engine's; only the actions write -----------------------

    def has_retry_permission(self, request, obj=None):
        return request.user.has_perm("backwave.retry_job")

    def has_cancel_permission(self, request, obj=None):
        return request.user.has_perm("backwave.cancel_job")

    # --- list -----------------------------------------------------------------------------------

    def get_queryset(self, request):
        # The list shows no payload or result: skip reading (and de-toasting) them.
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name.endswith("_changelist"):
            queryset = queryset.defer("payload", "return_value")
        return queryset

    def get_search_results(self, request, queryset, search_term):
        """A number finds that job by id; anything else matches part of the task's path."""
        term = search_term.strip().lstrip("#")
        if not term:
            return queryset, False
        if term.isascii() and term.isdigit():
            job_id = parse_row_id(term)
            return (queryset.filter(id=job_id) if job_id is not None else queryset.none()), False
        return queryset.filter(task_path__icontains=term), False

    @admin.display(description="task", ordering="task_path")
    def task_name(self, job):
        return format_html('<span title="{}">{}</span>', job.task_path, job.task_path.rsplit(".", 1)[-1])

    @admin.display(description="state", ordering="state")
    def state_badge(self, job):
        label = job.get_state_display()
        css = job.state
        if job.state == "ready" and job.run_at and job.run_at > timezone.now():
            label, css = "Scheduled", "scheduled"
        return format_html('<span class="bw-badge bw-{}">{}</span>', css, label)

    @admin.display(description="attempts")
    def attempts_shown(self, job):
        return f"{job.attempts} / {job.max_attempts}"

    @admin.display(description="enqueued", ordering="enqueued_at")
    def enqueued(self, job):
        return timestamp(job.enqueued_at)

    @admin.display(description="run at", ordering="run_at")
    def run_at_shown(self, job):
        return timestamp(job.run_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, job):
        return timestamp(job.finished_at)

    @admin.display(description="first started")
    def started(self, job):
        return timestamp(job.started_at)

    @admin.display(description="last attempted")
    def last_attempted(self, job):
        return timestamp(job.last_attempted_at)

    # --- detail ---------------------------------------------------------------------------------

    @admin.display(description="schedule")
    def schedule_link(self, job):
        if job.schedule_id is None:
            return "-"
        url = reverse("admin:backwave_schedule_change", args=[job.schedule_id], current_app=self.admin_site.name)
        slot = f" (slot {job.schedule_slot:%Y-%m-%d %H:%M:%S})" if job.schedule_slot else ""
        return format_html('<a href="{}">#{}</a>{}', url, job.schedule_id, slot)

    @admin.display(description="payload")
    @admin.display(description="Uniqueness key")
    def unique_key_shown(self, job):
        # The trigger clears the key once the job leaves the states it covers.
        return job.unique_key or ("released (left the covered states)" if job.unique_states else "—")

    @admin.display(description="Unique while")
    def unique_states_shown(self, job):
        return ", ".join(job.unique_states) if job.unique_states else "—"

    @admin.display(description="Limit key")
    def limit_key_shown(self, job):
        return job.limit_key or "—"

    def payload_json(self, job):
        return format_html("<pre class=\"bw-pre\">{}</pre>", json.dumps(job.payload, indent=2, ensure_ascii=False))

    @admin.display(description="return value")
    def return_value_json(self, job):
        if job.return_value is None:
            return "-"
        return format_html("<pre class=\"bw-pre\">{}</pre>", json.dumps(job.return_value, indent=2, ensure_ascii=False))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        attempts = []
        if (job_id := parse_row_id(object_id)) is not None:
            for attempt in Attempt.objects.filter(job_id=job_id).order_by("number"):
                duration = None
                if attempt.started_at and attempt.finished_at:
                    duration = (attempt.finished_at - attempt.started_at).total_seconds()
                attempts.append({"attempt": attempt, "duration": duration, "duration_shown": seconds_shown(duration)})
        extra_context = {
            **(extra_context or {}),
            "attempt_rows": attempts,
            "can_retry": self.has_retry_permission(request),
            "can_cancel": self.has_cancel_permission(request),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- actions --------------------------------------------------------------------------------

    @staticmethod
    def _ticked_job_ids(request) -> list[int] | None:
        """The ids the operator ticked, or None when the action covers every job the filters
        match ("select all"). Ticked jobs are acted on by id, not through the filters, so one
        that changed meanwhile is reported in its new state, and one purged meanwhile as gone."""
        if forms.BooleanField(required=False).to_python(request.POST.get("select_across")):
            return None
        return [parse_row_id(text) for text in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)]

    @admin.action(description="Retry now (failed or quarantined jobs)", permissions=["retry"], location=BOTH_LOCATIONS)
    def retry_now(self, request, queryset):
        ids = self._ticked_job_ids(request)
        result = actions.retry_jobs(queryset) if ids is None else actions.retry_job_ids(ids)
        report_job_action(request, result, done="retried", allowed="failed or quarantined")

    @admin.action(description="Cancel (ready or scheduled jobs)", permissions=["cancel"], location=BOTH_LOCATIONS)
    def cancel(self, request, queryset):
        ids = self._ticked_job_ids(request)
        result = actions.cancel_jobs(queryset) if ids is None else actions.cancel_job_ids(ids)
        report_job_action(request, result, done="cancelled", allowed="ready or scheduled")

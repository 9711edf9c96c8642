"""The operator's view: jobs, queues, pumps and schedules in the Django admin.

Every page is read-only to the admin's ordinary change form: rows belong to the engine, so the
only writes are the actions, each guarded by its own permission (``@admin.action(permissions=)``
plus a ``has_<name>_permission`` method and a custom model permission), and each one conditional
statement in ``backwave.operations``. A staff user with view permissions only sees everything
and can do nothing.

Page cost is bounded however large the job table grows: no page counts the whole table (see
``backwave.admin_stats``), and tests pin the number of queries of each page.
"""

from __future__ import annotations

import json
import re
from functools import cache

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Case, F, IntegerField, Value, When
from django.db.models.functions import Now
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from . import admin_stats, operations
from .models import Attempt, Job, JobState, Pump, PumpStatus, Queue, Schedule

MAX_ROW_ID = 2**63 - 1  # Job.id and Schedule.id are bigints
# ASCII only: str.isdigit() also accepts "²" and "٣", which int() refuses or reads as another number.
_ROW_ID_TEXT = re.compile(r"[0-9]{1,19}\Z")

GONE_SHOWN = 10  # ids listed in the "no longer exists" message before "and N more"
RUNNING_REFUSAL = "{n} job{s} {are} running under a worker's lease and {were} left alone: try again once {they} finish{es}."


def _plural(n: int) -> dict:
    one = n == 1
    return {"n": n, "s": "" if one else "s", "are": "is" if one else "are", "were": "was" if one else "were",
            "they": "it" if one else "they", "es": "es" if one else ""}


def parse_row_id(text) -> int | None:
    """The id that ``text`` spells in ASCII digits, or None when it names no possible row."""
    if not isinstance(text, str) or not _ROW_ID_TEXT.match(text):
        return None
    row_id = int(text)
    return row_id if 1 <= row_id <= MAX_ROW_ID else None


def report_job_action(request, result: operations.JobActionResult, *, done: str, allowed: str) -> None:
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


BOTH_LOCATIONS = [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]


def refuse_unpermitted_action(model_admin, request, location) -> None:
    """403 for a POST that asks for one of the admin's actions the user may not run.

    Django alone would drop such a request with "No action selected"; an operator (or a script)
    without the permission deserves a plain refusal."""
    if request.method != "POST":
        return
    own = set(model_admin.actions or ())
    permitted = model_admin.get_actions(request, action_location=location)
    prefix = "" if location == admin.ActionLocation.CHANGE_LIST else f"{location.value}-"
    for name in request.POST.getlist(f"{prefix}action"):
        if name in own and name not in permitted:
            raise PermissionDenied


def timestamp(moment):
    """A compact, second-precise time in the current time zone (the full one on hover)."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(), local.isoformat(), local.strftime("%m-%d %H:%M:%S"))


def seconds_shown(seconds):
    """0.00042 -> '0.42 ms', 1.5 -> '1.500 s'."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


class EngineRows:
    """ModelAdmin mixin: the rows are the engine's; nobody adds, edits or deletes them here,
    only the admin actions (each behind its own permission) write."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class RefuseUnpermittedActions:
    """ModelAdmin mixin: a POST for an action the user may not run gets a 403; the list page
    is titled ``changelist_title`` instead of Django's "Select ... to view"."""

    changelist_title = None

    def changelist_view(self, request, extra_context=None):
        refuse_unpermitted_action(self, request, admin.ActionLocation.CHANGE_LIST)
        if self.changelist_title:
            extra_context = {"title": self.changelist_title, **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        refuse_unpermitted_action(self, request, admin.ActionLocation.CHANGE_FORM)
        return super().change_view(request, object_id, form_url, extra_context)


class BigintIds:
    """ModelAdmin mixin for rows keyed by a bigint id: only ASCII digits name one, in its URL and
    in an action's selection. Django's own lookup reads "٣" as 3, and an action's filter fails
    on "²" or "abc" with a 500."""

    def get_object(self, request, object_id, from_field=None):
        if from_field in (None, "id", "pk") and parse_row_id(object_id) is None:
            return None  # Django's usual "... doesn't exist", as for any other missing row
        return super().get_object(request, object_id, from_field)

    def response_action(self, request, queryset, action_location=admin.ActionLocation.CHANGE_LIST):
        for text in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            if parse_row_id(text) is None:
                messages.error(request, f"{text!r} is not a {self.opts.verbose_name} id; nothing was changed.")
                return None
        return super().response_action(request, queryset, action_location)


class _StatisticsMixin:
    """One read of the planner's statistics per request, shared by the filters."""

    @staticmethod
    def statistics(request) -> admin_stats.TableStatistics:
        stats = getattr(request, "_backwave_statistics", None)
        if stats is None:
            stats = request._backwave_statistics = admin_stats.table_statistics()
        return stats


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
        stats = self.statistics(request)
        names = admin_stats.configured_queues() | set(stats.queue_rows) | set(stats.common_values("queue"))
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


@cache
def _registered_task_paths() -> tuple[str, ...]:
    """Wire names of the tasks the worker would find (imported once per process)."""
    from django.conf import settings

    from .shell.registry import TaskRegistry

    try:
        return tuple(sorted(TaskRegistry.discover(getattr(settings, "BACKWAVE", {}).get("TASK_MODULES", ()))))
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
    paginator = admin_stats.EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_now", "cancel"]
    fieldsets = [
        (None, {"fields": [("task_path", "queue", "state"), ("priority", "backend", "tags", "schedule_link")]}),
        ("Timing (database clock)", {"fields": [("enqueued", "run_at_shown", "started", "last_attempted", "finished")]}),
        ("Retries and lease", {"fields": [("attempts", "max_attempts", "worker_id"), ("backoff_base", "backoff_max", "lease_id")]}),
        ("Payload and result", {"fields": [("payload_json", "return_value_json")]}),
    ]
    readonly_fields = (
        "task_path", "queue", "state", "priority", "tags", "backend", "schedule_link", "enqueued", "run_at_shown",
        "started", "last_attempted", "finished", "attempts", "max_attempts", "backoff_base", "backoff_max",
        "worker_id", "lease_id", "payload_json", "return_value_json",
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
        result = operations.retry_jobs(queryset) if ids is None else operations.retry_job_ids(ids)
        report_job_action(request, result, done="retried", allowed="failed or quarantined")

    @admin.action(description="Cancel (ready or scheduled jobs)", permissions=["cancel"], location=BOTH_LOCATIONS)
    def cancel(self, request, queryset):
        ids = self._ticked_job_ids(request)
        result = operations.cancel_jobs(queryset) if ids is None else operations.cancel_job_ids(ids)
        report_job_action(request, result, done="cancelled", allowed="ready or scheduled")


@admin.register(Queue)
class QueueAdmin(EngineRows, admin.ModelAdmin):
    """The Queues page: one line per known queue, with or without a Queue row.

    Not Django's changelist: most queues have no row until someone pauses or limits them, and the
    line's numbers come from the job table. The actions still go through ``get_actions``, so
    Django's permission filtering decides who sees and runs them.
    """

    actions = ["pause", "resume", "set_limit"]

    def has_pause_permission(self, request, obj=None):
        return request.user.has_perm("backwave.pause_queue")

    def has_limit_permission(self, request, obj=None):
        return request.user.has_perm("backwave.limit_queue")

    def get_urls(self):
        # Only the overview: a queue has no page of its own (its jobs are one click away).
        return [path("", self.admin_site.admin_view(self.changelist_view), name="backwave_queue_changelist")]

    def _own_actions(self, request) -> dict:
        return {name: entry for name, entry in self.get_actions(request).items() if name in self.actions}

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        actions = self._own_actions(request)
        if request.method == "POST":
            return self._run_action(request, actions)
        statistics = admin_stats.table_statistics()
        lines = admin_stats.queue_lines(statistics)
        rate = admin_stats.throughput()
        for line in lines:
            line.per_minute = rate.per_queue.get(line.name, [0] * admin_stats.THROUGHPUT_MINUTES)
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "subtitle": None,
            "opts": self.opts,
            "lines": lines,
            "action_choices": [(name, action.description) for name, action in actions.items()],
            "covered_minutes": rate.covered_minutes,
            "count_cap": admin_stats.COUNT_CAP,
            "jobs_url": reverse("admin:backwave_job_changelist", current_app=self.admin_site.name),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/backwave/queue/overview.html", context)

    def _run_action(self, request, actions):
        here = HttpResponseRedirect(request.get_full_path())
        name = request.POST.get("action", "")
        names = request.POST.getlist("_selected_action")
        if name in self.actions and name not in actions:
            raise PermissionDenied
        if name not in actions:
            messages.error(request, "Choose an action.")
            return here
        if not names:
            messages.warning(request, "Select one or more queues first.")
            return here
        try:
            actions[name].func(self, request, names)
        except ValueError as error:
            messages.error(request, str(error))
        return here

    @admin.action(description="Pause (workers stop claiming; running jobs finish)", permissions=["pause"])
    def pause(self, request, names):
        n = operations.pause_queues(names)
        messages.success(request, f"Paused {n} queue{'' if n == 1 else 's'}: {', '.join(sorted(names))}.")

    @admin.action(description="Resume", permissions=["pause"])
    def resume(self, request, names):
        n = operations.resume_queues(names)
        messages.success(request, f"Resumed {n} queue{'' if n == 1 else 's'}: {', '.join(sorted(names))}.")

    @admin.action(description="Set concurrency limit (blank: unlimited)", permissions=["limit"])
    def set_limit(self, request, names):
        limit = operations.parse_concurrency_limit(request.POST.get("limit", ""), unlimited="leave it blank")
        n = operations.limit_queues(names, limit)
        shown = "unlimited" if limit is None else f"at most {limit} running at once"
        messages.success(request, f"{n} queue{'' if n == 1 else 's'} now {shown}: {', '.join(sorted(names))}.")


_PUMP_STATUS_ORDER = Case(
    When(status=PumpStatus.HALTED, then=Value(0)),
    When(status=PumpStatus.DEGRADED, then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


@admin.register(Pump)
class PumpAdmin(EngineRows, RefuseUnpermittedActions, admin.ModelAdmin):
    """Pumps as they last reported: halted first (with the reason), then degraded, then healthy."""

    changelist_title = "Pumps: halted first, then degraded, then healthy"

    list_display = ("status_badge", "reason_shown", "group", "host_pid", "worker_id", "in_flight", "heartbeat_age")
    list_display_links = ("status_badge", "worker_id")
    list_filter = ("status", "group")
    search_fields = ("worker_id", "hostname")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = ("worker_id", "status", "reason_full", "group", "hostname", "pid", "in_flight", "lease_duration", "started_at", "last_heartbeat_at", "heartbeat_age")
    readonly_fields = fields

    def get_queryset(self, request):
        # Annotated before ordering: the order is by the annotation (halted, degraded, healthy).
        queryset = self.model._default_manager.annotate(rank=_PUMP_STATUS_ORDER, age=Now() - F("last_heartbeat_at"))
        return queryset.order_by(*self.get_ordering(request))

    def get_ordering(self, request):
        return ["rank", "group", "worker_id"]

    @admin.display(description="status", ordering="rank")
    def status_badge(self, pump):
        return format_html('<span class="bw-badge bw-{}">{}</span>', pump.status, pump.get_status_display())

    @admin.display(description="host:pid", ordering="hostname")
    def host_pid(self, pump):
        return f"{pump.hostname}:{pump.pid}"

    @admin.display(description="reason")
    def reason_shown(self, pump):
        if not pump.reason:
            return ""
        return format_html('<span title="{}">{}</span>', pump.reason, Truncator(pump.reason).chars(140))

    @admin.display(description="reason")
    def reason_full(self, pump):
        return format_html('<pre class="bw-pre">{}</pre>', pump.reason) if pump.reason else "-"

    @admin.display(description="last heartbeat", ordering="-last_heartbeat_at")
    def heartbeat_age(self, pump):
        seconds = pump.age.total_seconds()
        # A halted pump stopped heartbeating on purpose and says why: it is never "stale".
        if pump.status != PumpStatus.HALTED and seconds > pump.lease_duration:
            return format_html('<span class="bw-stale" title="older than its lease ({} s)">{} s ago · stale</span>', f"{pump.lease_duration:g}", f"{seconds:.0f}")
        return f"{seconds:.0f} s ago"


@admin.register(Schedule)
class ScheduleAdmin(EngineRows, RefuseUnpermittedActions, BigintIds, admin.ModelAdmin):
    changelist_title = "Schedules"
    list_display = ("name", "task_path", "cron", "queue", "next_run", "last_slot", "enabled")
    list_filter = ("enabled", "queue")
    search_fields = ("name", "task_path")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["enable", "disable"]
    fields = ("name", "task_path", "cron", "enabled", "next_run", "last_slot", "queue", "priority", "args", "kwargs", "max_attempts", "backoff_base", "backoff_max", "backend", "tags", "created_at", "updated_at")
    readonly_fields = fields

    def has_toggle_permission(self, request, obj=None):
        return request.user.has_perm("backwave.toggle_schedule")

    @admin.action(description="Enable (from its next slot)", permissions=["toggle"])
    def enable(self, request, queryset):
        n = operations.set_schedules_enabled(queryset, True)
        messages.success(request, f"Enabled {n} schedule{'' if n == 1 else 's'}.")

    @admin.action(description="Disable", permissions=["toggle"])
    def disable(self, request, queryset):
        n = operations.set_schedules_enabled(queryset, False)
        messages.success(request, f"Disabled {n} schedule{'' if n == 1 else 's'}.")

"""The Jobs page: filters that never scan the job table, search by id, task, argument value or
tag (backwave/ops/search.py), each row's worker, timing and last error, every attempt on the
detail page, and the retry and cancel actions (on ticked jobs, or on everything a filter
matches, in bounded batches after a confirmation page), each recorded in the admin's history."""

from __future__ import annotations

import json
from functools import cache

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models.fields import BLANK_CHOICE_DASH
from django.db.models.functions import Now
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from .. import conf
from ..models import Attempt, Job, JobState, Pump
from ..ops import actions, stats, tracebacks
from ..ops import search as job_search
from ..ops.formatting import attempt_row
from ..ops.history import record_history
from ..ops.redaction import redacted
from ..store import operator
from ..ops.history import history_note
from .databases import OnSelectedDatabase, selected_database, switch_view
from .common import BOTH_LOCATIONS, BigintIds, EngineRows, RefuseUnpermittedActions, duration_text, parse_row_id, timestamp

LINKS_SHOWN = 50  # ancestors, and dependents, listed on a job's page (with the total of each)
GONE_SHOWN = 10  # ids listed in the "no longer exists" message before "and N more"
RUNNING_REFUSAL = "{n} job{s} {are} running under a worker's lease and {were} left alone: try again once {they} finish{es}."


def _plural(n: int) -> dict:
    one = n == 1
    return {
        "n": n,
        "s": "" if one else "s",
        "are": "is" if one else "are",
        "were": "was" if one else "were",
        "they": "it" if one else "they",
        "es": "es" if one else "",
    }


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
        shown = ", ".join(map(str, result.gone[:GONE_SHOWN])) + (
            f" and {len(result.gone) - GONE_SHOWN} more" if len(result.gone) > GONE_SHOWN else ""
        )
        one = len(result.gone) == 1
        messages.warning(
            request,
            f"Job{'' if one else 's'} {shown} no longer exist{'s' if one else ''} (deleted since the page was loaded, e.g. by the retention purge).",
        )
    if not changed and not result.refused and not result.gone and not result.requested:
        messages.warning(request, "No such job.")


def _without_requests(result: actions.JobActionResult) -> actions.JobActionResult:
    """The result with its cancel requests left out of ``changed``: they are reported on their own."""
    asked = set(result.requested)
    return actions.JobActionResult(
        changed=tuple(i for i in result.changed if i not in asked),
        refused=result.refused,
        gone=result.gone,
        changed_rows=result.changed_rows,
        batches=result.batches,
        requested=result.requested,
    )


class _StatisticsMixin:
    """One read of the planner's statistics per request, shared by the filters."""

    @staticmethod
    def statistics(request) -> stats.TableStatistics:
        statistics = getattr(request, "_backwave_statistics", None)
        if statistics is None:
            statistics = request._backwave_statistics = stats.table_statistics(selected_database(request))
        return statistics


class JobStateFilter(admin.SimpleListFilter):
    """State, with ready split into due now and scheduled for later (no query for its choices)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [
            ("ready", "Ready (due)"),
            ("scheduled", "Scheduled (later)"),
            *[(value, label) for value, label in JobState.choices if value != "ready"],
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "ready":
            return queryset.filter(state="ready", run_at__lte=Now())
        if value == "scheduled":
            return queryset.filter(state="ready", run_at__gt=Now())
        if value in JobState.values:
            return queryset.filter(state=value)
        return queryset


def report_once(request, text: str) -> None:
    """An error message, once per request however often the changelist is built."""
    reported = request.__dict__.setdefault("_backwave_reported", set())
    if text not in reported:
        reported.add(text)
        messages.error(request, text)


class _CheckedValue:
    """A filter whose value comes from the URL: one PostgreSQL cannot compare (a NUL) selects no
    job and says why, instead of failing the page's query with a DataError."""

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        try:
            job_search.check_text(value, f"The {self.title} filter")
        except job_search.SearchError as error:
            report_once(request, str(error))
            return queryset.none()
        return self.narrow(queryset, value)


class QueueFilter(_CheckedValue, _StatisticsMixin, admin.SimpleListFilter):
    """Queues from settings, Queue rows and the planner's common values: never a DISTINCT scan."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        statistics = self.statistics(request)
        names = conf.configured_queue_names() | set(statistics.queue_rows) | set(statistics.common_values("queue"))
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def narrow(self, queryset, value):
        return queryset.filter(queue=value)


@cache
def _registered_task_paths() -> tuple[str, ...]:
    """Wire names of the tasks the worker would find (imported once per process)."""
    from ..tasking.registry import TaskRegistry

    try:
        return tuple(sorted(TaskRegistry.discover(conf.get_setting("TASK_MODULES"))))
    except Exception:  # a broken tasks module must not take the admin down; the worker reports it
        return ()


class TaskFilter(_CheckedValue, _StatisticsMixin, admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request, model_admin):
        paths = set(_registered_task_paths()) | set(self.statistics(request).common_values("task_path"))
        if self.value():
            paths.add(self.value())
        return [(p, p.rsplit(".", 1)[-1] + f" ({p.rsplit('.', 1)[0]})" if "." in p else p) for p in sorted(paths)]

    def narrow(self, queryset, value):
        return queryset.filter(task_path=value)


class TagFilter(_CheckedValue, _StatisticsMixin, admin.SimpleListFilter):
    """Tags the planner sees most often (its most common elements of ``tags``), and the one
    asked for; served by the GIN index on tags."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        tags = set(self.statistics(request).common_values("tags"))
        if self.value():
            tags.add(self.value())
        return [(tag, tag) for tag in sorted(tags)]

    def narrow(self, queryset, value):
        return queryset.filter(job_search.tags_condition([value]))


class WorkerFilter(_CheckedValue, admin.SimpleListFilter):
    """The jobs of one pump (its worker id): where the Pumps page links its running jobs. Shown
    only while set, so the operator sees it and can clear it."""

    title = "worker"
    parameter_name = "worker"

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def narrow(self, queryset, value):
        return queryset.filter(worker_id=value)


# Characters of each traceback's tail read for the list's error column: the exception's message
# is at the end, and a page of 50 rows never reads 50 whole tracebacks.
ERROR_TAIL_CHARS = 2000
ERROR_SHOWN_CHARS = 60


class JobChangeList(ChangeList):
    """Django's change list plus one query for the page's rows: each job's latest attempt (error
    and duration), how long a running job has run, and whether its pump is still there."""

    def get_results(self, request):
        if getattr(request, "_backwave_filters_only", False):
            # The bulk actions' page wants the filtered queryset, not a page of it.
            self.result_list, self.result_count, self.full_result_count = [], 0, None
            self.can_show_all, self.multi_page, self.paginator = False, False, None
            return
        super().get_results(request)
        jobs = list(self.result_list)
        if jobs:
            with connections[self.result_list.db].cursor() as cursor:
                details = operator.jobs_page_details(cursor, [job.pk for job in jobs], tail=ERROR_TAIL_CHARS)
            for job in jobs:
                error_class, tail, duration, running_for, pump_exists = details.get(job.pk, ("", "", None, None, False))
                job.last_error_class = error_class or ""
                job.last_error = tracebacks.error_message(error_class or "", tail or "") if error_class else ""
                job.last_duration = duration
                job.running_for = running_for
                job.pump_exists = pump_exists
        self.result_list = jobs


BULK_ACTIONS = {
    # name -> (action, permission method, verb, past tense, which jobs it applies to)
    "retry-all": ("retry", "has_retry_permission", "retry", "retried", "failed, quarantined or held"),
    "cancel-all": ("cancel", "has_cancel_permission", "cancel", "cancelled", "ready, scheduled, waiting or held"),
}


@admin.register(Job)
class JobAdmin(OnSelectedDatabase, EngineRows, RefuseUnpermittedActions, BigintIds, admin.ModelAdmin):
    changelist_title = "Jobs"
    list_display = (
        # Enqueued and run-at are on the job page (the id is in enqueue order; a scheduled job's
        # badge says when it is due): the list keeps to what says where a job stands, so it
        # fits a laptop's screen beside the filters.
        "id",
        "task_name",
        "queue",
        "state_badge",
        "attempts_shown",
        "started_shown",
        "duration_shown",
        "finished",
        "worker_shown",
        "error_shown",
    )
    list_display_links = ("id", "task_name")
    list_filter = (JobStateFilter, QueueFilter, TaskFilter, TagFilter, WorkerFilter)
    search_fields = ("task_path",)
    search_help_text = (
        "A job id; key=value for a keyword argument (customer.email=a@example.com inside a dict); arg:value for a "
        "positional one; tag:name; or part of a task's import path. Terms combine; quote a value that holds a space."
    )
    ordering = ("-id",)
    list_per_page = 50
    paginator = stats.EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_now", "cancel"]
    fieldsets = [
        (None, {"fields": [("task_path", "queue", "state"), ("priority", "backend", "tags", "schedule_link")]}),
        ("Timing", {"fields": [("enqueued", "run_at_shown", "started", "last_attempted", "finished")]}),
        (
            "Retries and lease",
            {"fields": [("attempts", "max_attempts", "worker_link"), ("backoff_base", "backoff_max", "lease_id")]},
        ),
        ("Admission", {"fields": [("unique_key_shown", "unique_states_shown", "limit_key_shown")]}),
        ("Payload and result", {"fields": [("payload_json", "return_value_json"), "output_json"]}),
        ("Attempt control", {"fields": [("timeout", "cancel_request"), ("progress_json", "metadata_json")]}),
    ]
    readonly_fields = (
        "task_path",
        "queue",
        "state",
        "priority",
        "tags",
        "backend",
        "schedule_link",
        "enqueued",
        "run_at_shown",
        "started",
        "last_attempted",
        "finished",
        "attempts",
        "max_attempts",
        "backoff_base",
        "backoff_max",
        "worker_link",
        "lease_id",
        "payload_json",
        "return_value_json",
        "output_json",
        "timeout",
        "cancel_request",
        "progress_json",
        "metadata_json",
        "unique_key_shown",
        "unique_states_shown",
        "limit_key_shown",
    )

    # --- permissions: the rows are the engine's; only the actions write -----------------------

    def has_retry_permission(self, request, obj=None):
        return request.user.has_perm("backwave.retry_job")

    def has_cancel_permission(self, request, obj=None):
        return request.user.has_perm("backwave.cancel_job")

    def has_cancel_running_permission(self, request, obj=None):
        return request.user.has_perm("backwave.cancel_job") and request.user.has_perm("backwave.cancel_running_job")

    # --- list -----------------------------------------------------------------------------------

    def get_changelist(self, request, **kwargs):
        return JobChangeList

    def get_queryset(self, request):
        # The list shows no payload or result: skip reading (and de-toasting) them.
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name.endswith(("_changelist", "_bulk")):
            queryset = queryset.defer("payload", "return_value", "output")
        return queryset

    def get_search_results(self, request, queryset, search_term):
        """The search box: ids, argument values, tags, task paths (backwave/ops/search.py)."""
        if not search_term.strip():
            return queryset, False
        try:
            search = job_search.parse(search_term)
        except job_search.SearchError as error:
            report_once(request, str(error))
            return queryset.none(), False
        return search.apply(queryset), False

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), **self._bulk_links(request), **time_zone_context()}
        return super().changelist_view(request, extra_context)

    def _bulk_links(self, request) -> dict:
        query = request.GET.urlencode()
        links = {}
        for name, (_action, permission, *_texts) in BULK_ACTIONS.items():
            if getattr(self, permission)(request):
                url = reverse(f"{self.admin_site.name}:backwave_job_bulk", args=[name])
                links[f"{name.replace('-', '_')}_url"] = f"{url}?{query}" if query else url
        return links

    @admin.display(description="task", ordering="task_path")
    def task_name(self, job):
        return format_html('<span title="{}">{}</span>', job.task_path, job.task_path.rsplit(".", 1)[-1])

    @admin.display(description="state", ordering="state")
    def state_badge(self, job):
        label = job.get_state_display()
        css = job.state
        if job.state == "ready" and job.run_at and job.run_at > timezone.now():
            due = timezone.localtime(job.run_at)
            return format_html(
                '<span class="bw-badge bw-scheduled" title="due {} {}">Scheduled</span>',
                f"{due:%Y-%m-%d %H:%M:%S}",
                timezone.get_current_timezone_name(),
            )
        if job.state == "running" and job.cancel_requested_at is not None:
            label = "Cancelling"
        badge = format_html('<span class="bw-badge bw-{}">{}</span>', css, label)
        if job.state == "running" and job.progress is not None:
            # What the handler last reported (context.set_progress), as of the last heartbeat.
            shown = json.dumps(redacted(job, "progress"), ensure_ascii=False)
            badge = format_html(
                '{} <span class="bw-note bw-progress">{}</span>', badge, shown if len(shown) <= 40 else shown[:39] + "…"
            )
        return badge

    @admin.display(description="attempts")
    def attempts_shown(self, job):
        return f"{job.attempts} / {job.max_attempts}"

    @admin.display(description="enqueued", ordering="enqueued_at")
    def enqueued(self, job):
        return timestamp(job.enqueued_at)

    @admin.display(description="run at", ordering="run_at")
    def run_at_shown(self, job):
        return timestamp(job.run_at)

    @admin.display(description="started", ordering="last_attempted_at")
    def started_shown(self, job):
        return timestamp(job.last_attempted_at)

    @admin.display(description="duration")
    def duration_shown(self, job):
        running_for = getattr(job, "running_for", None)
        if job.state == "running" and running_for is not None:
            return format_html(
                '<span class="bw-running-for" title="running for this long so far">{} …</span>', duration_text(running_for)
            )
        return duration_text(getattr(job, "last_duration", None))

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, job):
        return timestamp(job.finished_at)

    @admin.display(description="worker", ordering="worker_id")
    def worker_shown(self, job):
        return self._worker_html(job, getattr(job, "pump_exists", False), short=True)

    @admin.display(description="last error")
    def error_shown(self, job):
        message = getattr(job, "last_error", "")
        error_class = getattr(job, "last_error_class", "")
        if not error_class:
            return ""
        short = error_class.rsplit(".", 1)[-1]
        shown = Truncator(f"{short}: {message}" if message else short).chars(ERROR_SHOWN_CHARS)
        return format_html('<span class="bw-error" title="{}">{}</span>', f"{error_class}: {message}", shown)

    def _worker_html(self, job, pump_exists: bool, *, short: bool):
        if not job.worker_id:
            return "-"
        shown = job.worker_id if not short else Truncator(job.worker_id).chars(18)
        if pump_exists:
            url = reverse(f"{self.admin_site.name}:backwave_pump_change", args=[job.worker_id])
            return format_html('<a class="bw-worker" href="{}" title="the pump {}">{}</a>', url, job.worker_id, shown)
        return format_html(
            '<span class="bw-worker bw-muted" title="{}: this pump has stopped (no row left)">{}</span>', job.worker_id, shown
        )

    @admin.display(description="started (first attempt)")
    def started(self, job):
        return timestamp(job.started_at)

    @admin.display(description="last attempted")
    def last_attempted(self, job):
        return timestamp(job.last_attempted_at)

    # --- detail ---------------------------------------------------------------------------------

    @admin.display(description="worker")
    def worker_link(self, job):
        return self._worker_html(
            job,
            Pump.objects.using(job._state.db).filter(worker_id=job.worker_id).exists() if job.worker_id else False,
            short=False,
        )

    @admin.display(description="schedule")
    def schedule_link(self, job):
        if job.schedule_id is None:
            return "-"
        url = reverse("admin:backwave_schedule_change", args=[job.schedule_id], current_app=self.admin_site.name)
        slot = f" (slot {job.schedule_slot:%Y-%m-%d %H:%M:%S})" if job.schedule_slot else ""
        return format_html('<a href="{}">#{}</a>{}', url, job.schedule_id, slot)

    @admin.display(description="Uniqueness key")
    def unique_key_shown(self, job):
        # The trigger clears the key once the job leaves the states it covers.
        return redacted(job, "unique_key") or ("released (left the covered states)" if job.unique_states else "—")

    @admin.display(description="Unique while")
    def unique_states_shown(self, job):
        return ", ".join(job.unique_states) if job.unique_states else "—"

    @admin.display(description="Limit key")
    def limit_key_shown(self, job):
        return redacted(job, "limit_key") or "—"

    @admin.display(description="payload")
    def payload_json(self, job):
        return format_html('<pre class="bw-pre">{}</pre>', json.dumps(redacted(job, "payload"), indent=2, ensure_ascii=False))

    @admin.display(description="cancel requested")
    def cancel_request(self, job):
        if job.cancel_requested_at is None:
            return "-"
        return f"by {job.cancel_requested_by or 'unknown'} at {timestamp(job.cancel_requested_at)}"

    @admin.display(description="progress (as of the last heartbeat)")
    def progress_json(self, job):
        return self._json_block(redacted(job, "progress"))

    @admin.display(description="metadata")
    def metadata_json(self, job):
        return self._json_block(redacted(job, "metadata"))

    @staticmethod
    def _json_block(value):
        if value is None:
            return "-"
        return format_html('<pre class="bw-pre">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False))

    @admin.display(description="return value")
    def return_value_json(self, job):
        if job.return_value is None:
            return "-"
        return format_html(
            '<pre class="bw-pre">{}</pre>', json.dumps(redacted(job, "return_value"), indent=2, ensure_ascii=False)
        )

    def get_object(self, request, object_id, from_field=None):
        job = super().get_object(request, object_id, from_field)
        request._backwave_job = job  # the action choices depend on its state
        return job

    def get_action_choices(self, request, default_choices=BLANK_CHOICE_DASH, action_location=admin.ActionLocation.CHANGE_LIST):
        choices = super().get_action_choices(request, default_choices, action_location=action_location)
        job = getattr(request, "_backwave_job", None)
        if action_location != admin.ActionLocation.CHANGE_FORM or job is None:
            return choices
        # The job page offers only what applies to the job as it is now.
        applies = {"retry_now": job.state in actions.RETRYABLE_STATES, "cancel": job.state in actions.CANCELLABLE_STATES}
        return [(name, text) for name, text in choices if applies.get(name, True)]

    @admin.display(description="job output")
    def output_json(self, job):
        if not job.output:
            return "-"
        return format_html('<pre class="bw-pre">{}</pre>', json.dumps(redacted(job, "output"), indent=2, ensure_ascii=False))

    def _workflow(self, request, job_id: int) -> dict:
        """The job's ancestors and dependents (links, states, policies), in one statement."""
        with connections[selected_database(request)].cursor() as cursor:
            rows = operator.job_links(cursor, job_id, limit=LINKS_SHOWN)
        sides: dict[str, dict] = {"ancestor": {"rows": [], "total": 0}, "dependent": {"rows": [], "total": 0}}
        for side, linked_id, task_path, state, on_failure, total in rows:
            url = reverse("admin:backwave_job_change", args=[linked_id], current_app=self.admin_site.name)
            sides[side]["rows"].append(
                {
                    "id": linked_id,
                    "url": url,
                    "task": task_path.rsplit(".", 1)[-1],
                    "task_path": task_path,
                    "state": state,
                    "on_failure": on_failure,
                }
            )
            sides[side]["total"] = total
        unfinished = [row for row in sides["ancestor"]["rows"] if row["state"] != "succeeded"]
        return {"ancestors": sides["ancestor"], "dependents": sides["dependent"], "unfinished_ancestors": unfinished}

    def change_view(self, request, object_id, form_url="", extra_context=None):
        attempts = []
        workflow = {}
        if (job_id := parse_row_id(object_id)) is not None:
            workflow = self._workflow(request, job_id)
            attempts = [
                attempt_row(attempt)
                for attempt in Attempt.objects.using(selected_database(request)).filter(job_id=job_id).order_by("number")
            ]
        extra_context = {
            **(extra_context or {}),
            **time_zone_context(),
            "attempt_rows": attempts,
            "workflow": workflow,
            "can_retry": self.has_retry_permission(request),
            "can_cancel": self.has_cancel_permission(request),
            "can_cancel_running": self.has_cancel_running_permission(request),
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

    def _act(self, request, queryset, action: str, **options):
        ids = self._ticked_job_ids(request)
        note = database_note(request)
        on_batch = lambda result: record_history(request.user, action, result, note)  # noqa: E731
        if ids is None:
            return actions.act_on_matching(queryset, action, on_batch=on_batch, **options)
        return actions.act_on_ids(ids, action, on_batch=on_batch, using=queryset.db, **options)

    @admin.action(description="Retry now (failed, quarantined or held jobs)", permissions=["retry"], location=BOTH_LOCATIONS)
    def retry_now(self, request, queryset):
        report_job_action(request, self._act(request, queryset, "retry"), done="retried", allowed="failed, quarantined or held")

    @admin.action(
        description="Cancel (ready, scheduled, waiting or held jobs; running ones with its own permission)",
        permissions=["cancel"],
        location=BOTH_LOCATIONS,
    )
    def cancel(self, request, queryset):
        running = self.has_cancel_running_permission(request)
        result = self._act(request, queryset, "cancel", by=f"admin:{request.user.get_username()}", running=running)
        if result.requested:
            n = len(result.requested)
            messages.success(
                request,
                f"Asked the worker{'' if n == 1 else 's'} of {n} running job{'' if n == 1 else 's'} to stop; "
                f"{'it ends' if n == 1 else 'they end'} cancelled.",
            )
            result = _without_requests(result)
        report_job_action(
            request,
            result,
            done="cancelled",
            allowed="ready, scheduled, waiting, held or running" if running else "ready, scheduled, waiting or held",
        )

    # --- retry all / cancel all matching the filters ------------------------------------------

    def get_urls(self):
        bulk = path("bulk/<str:name>/", self.admin_site.admin_view(self.bulk_view), name="backwave_job_bulk")
        # The switch of every BackWave page (admin/databases.py) lives here: a ModelAdmin's URLs
        # are the only ones an app can add to whichever admin site registers it.
        switch = path("database/", self.admin_site.admin_view(switch_view), name="backwave_database_switch")
        return [bulk, switch, *super().get_urls()]

    def bulk_view(self, request, name):
        """Retry (or cancel) every job the changelist's filters and search match: a GET shows how
        many and asks; the POST acts in batches of actions.BATCH_SIZE and returns to the list."""
        if name not in BULK_ACTIONS:
            raise PermissionDenied
        action, permission, verb, done, states = BULK_ACTIONS[name]
        # view_job as well: the page counts what a search matches, which would otherwise let a
        # user who may not list jobs guess argument values one search at a time.
        if not (self.has_view_permission(request) and getattr(self, permission)(request)):
            raise PermissionDenied
        query = request.GET.copy()
        for internal in ("p", "o", "e"):  # page, ordering and Django's error flag select nothing
            query.pop(internal, None)
        changelist_url = reverse(f"{self.admin_site.name}:backwave_job_changelist")
        back = f"{changelist_url}?{query.urlencode()}" if query else changelist_url
        request._backwave_filters_only = True
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            messages.error(request, "Those filters select nothing: choose them again on the jobs list.")
            return HttpResponseRedirect(changelist_url)
        if not changelist.search_form_class(request.GET).is_valid() or getattr(request, "_backwave_reported", None):
            # Django drops a search its form refuses (a NUL) and lists every job instead; acting
            # on "everything" for a search that was asked would be the worst reading of it.
            messages.error(request, f"Nothing was {done}: the search or a filter cannot be run as given (see above).")
            return HttpResponseRedirect(back)
        matching = changelist.queryset.filter(state__in=actions.ALLOWED_STATES[action])
        if request.method == "POST":
            described = describe_filters(query)
            note = (f" by “{verb} all matching” ({described})" if described else f" by “{verb} all”") + database_note(request)
            result = actions.act_on_matching(
                changelist.queryset,
                action,
                on_batch=lambda batch: record_history(request.user, action, batch, note),
                **({"by": f"admin:{request.user.get_username()}"} if action == "cancel" else {}),
            )
            report_job_action(request, result, done=done, allowed=states)
            if result.batches > 1:
                messages.info(
                    request, f"Done in {result.batches} batches of up to {actions.BATCH_SIZE:,} jobs, each committed on its own."
                )
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{verb.capitalize()} all matching jobs?",
            "subtitle": None,
            "opts": self.opts,
            "verb": verb,
            "states": states,
            "count": matching.count(),
            "filters": describe_filters(query),
            "back_url": back,
            "batch_size": actions.BATCH_SIZE,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/backwave/job/bulk_confirmation.html", context)


def database_note(request) -> str:
    """What the admin's history adds to an action's entry on a database other than the first:
    ids are per database, so "job 7" alone would say the first database's job 7."""
    return history_note(selected_database(request))


def describe_filters(query) -> str:
    """The changelist's query string as an operator reads it: state=failed, queue=emails, search “x”."""
    parts = []
    for key, values in query.lists():
        for value in values:
            parts.append(f"search “{value}”" if key == "q" else f"{key}={value}")
    return ", ".join(parts)


def time_zone_context() -> dict:
    """The zone the page's times are rendered in (Django's current one), for the note that
    names it and for local_times.js, which can show them in the browser's zone instead."""
    return {"server_time_zone": timezone.get_current_timezone_name(), "uses_tz": settings.USE_TZ}

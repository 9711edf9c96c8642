"""The Queues page: one line per queue with its depths and last hour's throughput, and the
pause, resume and concurrency-limit actions."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ..models import Queue
from ..ops import actions, stats
from ..queue_rules import parse_concurrency_limit
from .common import EngineRows
from .databases import selected_database, several_databases


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
        using = selected_database(request)
        with stats.without_jit(using):
            statistics = stats.table_statistics(using)
            lines = stats.queue_lines(statistics, using, unserved=stats.unserved_queues(using))
            rate = stats.throughput(using)
        if several_databases():
            lines = stats.lines_living_in(lines, using)
        for line in lines:
            line.per_minute = rate.per_queue.get(line.name, [0] * stats.THROUGHPUT_MINUTES)
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "subtitle": None,
            "opts": self.opts,
            "lines": lines,
            "action_choices": [(name, action.description) for name, action in actions.items()],
            "covered_minutes": rate.covered_minutes,
            "count_cap": stats.COUNT_CAP,
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
        n = actions.pause_queues(names, using=selected_database(request))
        messages.success(request, f"Paused {n} queue{'' if n == 1 else 's'}: {', '.join(sorted(names))}.")

    @admin.action(description="Resume", permissions=["pause"])
    def resume(self, request, names):
        n = actions.resume_queues(names, using=selected_database(request))
        messages.success(request, f"Resumed {n} queue{'' if n == 1 else 's'}: {', '.join(sorted(names))}.")

    @admin.action(description="Set concurrency limit (blank: unlimited)", permissions=["limit"])
    def set_limit(self, request, names):
        limit = parse_concurrency_limit(request.POST.get("limit", ""), unlimited="leave it blank")
        n = actions.limit_queues(names, limit, using=selected_database(request))
        shown = "unlimited" if limit is None else f"at most {limit} running at once"
        messages.success(request, f"{n} queue{'' if n == 1 else 's'} now {shown}: {', '.join(sorted(names))}.")

"""The Schedules page, and enabling or disabling schedules."""

from __future__ import annotations

from django.contrib import admin, messages

from ..models import Schedule
from ..ops import actions
from .common import BigintIds, EngineRows, RefuseUnpermittedActions, timestamp_column
from .databases import OnSelectedDatabase


@admin.register(Schedule)
class ScheduleAdmin(OnSelectedDatabase, EngineRows, RefuseUnpermittedActions, BigintIds, admin.ModelAdmin):
    changelist_title = "Schedules"
    live_refresh = False  # a schedule changes when a worker starts or an operator toggles it, not by the second
    list_display = ("name", "task_path", "cron", "queue", "next_run_shown", "last_slot_shown", "enabled")
    list_filter = ("enabled", "queue")
    search_fields = ("name", "task_path")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["enable", "disable"]
    fields = (
        "name",
        "task_path",
        "cron",
        "enabled",
        "next_run_shown",
        "last_slot_shown",
        "queue",
        "priority",
        "args",
        "kwargs",
        "max_attempts",
        "backoff_base",
        "backoff_max",
        "backend",
        "tags",
        "created_at_shown",
        "updated_at_shown",
    )
    readonly_fields = fields
    next_run_shown = timestamp_column("next_run", "next run")
    last_slot_shown = timestamp_column("last_slot", "last slot")
    created_at_shown = timestamp_column("created_at", "created at")
    updated_at_shown = timestamp_column("updated_at", "updated at")

    def has_toggle_permission(self, request, obj=None):
        return request.user.has_perm("backwave.toggle_schedule")

    @admin.action(description="Enable (from its next slot)", permissions=["toggle"])
    def enable(self, request, queryset):
        n = actions.set_schedules_enabled(queryset, True)
        messages.success(request, f"Enabled {n} schedule{'' if n == 1 else 's'}.")

    @admin.action(description="Disable", permissions=["toggle"])
    def disable(self, request, queryset):
        n = actions.set_schedules_enabled(queryset, False)
        messages.success(request, f"Disabled {n} schedule{'' if n == 1 else 's'}.")

"""The Pumps page: halted first with the reason, then degraded, then healthy."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import F
from django.db.models.functions import Now
from django.utils.html import format_html
from django.utils.text import Truncator

from ..models import Pump, PumpStatus, worst_status_first
from .common import EngineRows, RefuseUnpermittedActions

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
        queryset = self.model._default_manager.annotate(rank=worst_status_first(), age=Now() - F("last_heartbeat_at"))
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

"""The Pumps page: what each pump is, judged by its lease and not only by what it last reported.

A pump writes its own row, so a pump that is killed keeps its last word ("healthy", 16 in flight)
until maintenance forgets it. The page therefore derives the status it shows from the row and the
pump's lease (``Pump.objects.with_shown_status``, by the database clock): halted, lost (no live
lease), stale (a heartbeat older than the lease), degraded, healthy, in that order; and it counts
each pump's running jobs live from the job table, in one aggregate query for the page.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import connections
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from ..models import Pump, PumpStatus, ShownPumpStatus
from ..store import operator
from .common import EngineRows, RefuseUnpermittedActions, timestamp_column
from .databases import selected_database


def count_in_flight(pumps, using: str) -> None:
    """Set ``live_in_flight`` on each of ``pumps``: one query, however many they are."""
    with connections[using].cursor() as cursor:
        counts = operator.pumps_in_flight(cursor, [pump.worker_id for pump in pumps])
    for pump in pumps:
        pump.live_in_flight = counts.get(pump.worker_id, 0)


class PumpChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        pumps = list(self.result_list)
        if pumps:
            count_in_flight(pumps, self.result_list.db)
        self.result_list = pumps


@admin.register(Pump)
class PumpAdmin(EngineRows, RefuseUnpermittedActions, admin.ModelAdmin):
    """Pumps worst first: halted (with the reason), lost, stale, degraded, healthy."""

    changelist_title = "Pumps: halted first, then lost, stale, degraded, healthy"

    list_display = ("status_badge", "reason_shown", "group", "host_pid", "worker_id", "in_flight_shown", "heartbeat_age")
    list_display_links = ("status_badge", "worker_id")
    list_filter = ("status", "group")
    search_fields = ("worker_id", "hostname")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "worker_id",
        "status_badge",
        "reason_full",
        "group",
        "hostname",
        "pid",
        "in_flight_shown",
        "lease_duration",
        "started_at_shown",
        "last_heartbeat_at_shown",
        "heartbeat_age",
    )
    readonly_fields = fields
    started_at_shown = timestamp_column("started_at", "started at")
    last_heartbeat_at_shown = timestamp_column("last_heartbeat_at", "last heartbeat at")

    def get_changelist(self, request, **kwargs):
        return PumpChangeList

    def get_queryset(self, request):
        # Annotated before ordering: the order is by the derived status (worst first).
        queryset = self.model._default_manager.using(selected_database(request)).with_shown_status()
        return queryset.order_by(*self.get_ordering(request))

    def get_ordering(self, request):
        return ["rank", "group", "worker_id"]

    @admin.display(description="status", ordering="rank")
    def status_badge(self, pump):
        shown = ShownPumpStatus(pump.shown_status)
        if shown.value == pump.status:
            return format_html('<span class="bw-badge bw-{}">{}</span>', shown.value, shown.label)
        # Lost or stale: what the pump itself last said is still worth seeing.
        why = "no live lease" if shown == ShownPumpStatus.LOST else "no heartbeat for longer than its lease"
        return format_html(
            '<span class="bw-badge bw-{}" title="{}; it last reported {}">{}</span>',
            shown.value,
            why,
            pump.get_status_display().lower(),
            shown.label,
        )

    @admin.display(description="host:pid", ordering="hostname")
    def host_pid(self, pump):
        return f"{pump.hostname}:{pump.pid}"

    @admin.display(description="in flight")
    def in_flight_shown(self, pump):
        # The change page shows one pump, outside the change list: its own single count.
        if not hasattr(pump, "live_in_flight"):
            count_in_flight([pump], pump._state.db)
        # The count links to those jobs: the Jobs list filtered by this pump's worker id.
        url = reverse(f"{self.admin_site.name}:backwave_job_changelist")
        query = urlencode({"state": "running", "worker": pump.worker_id})
        return format_html(
            '<a href="{}?{}" class="bw-pump-jobs" title="this pump\'s running jobs">{}</a>', url, query, pump.live_in_flight
        )

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
            return format_html(
                '<span class="bw-stale" title="older than its lease ({} s)">{} s ago · stale</span>',
                f"{pump.lease_duration:g}",
                f"{seconds:.0f}",
            )
        return f"{seconds:.0f} s ago"

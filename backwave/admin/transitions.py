"""The Transitions page: what the observer loop has still to deliver, and what it gave up on.

A row is a transition some observer watches (backwave/observers.py), kept until every observer of
it ran: pending ones wait for their next try (or a deliverer holds them), dead ones ran out of
tries and wait for an operator. *Retry delivery* makes the chosen rows due at once with a full
set of tries (the observers that already ran for a row are not run again); *Discard* deletes dead
rows, and pending ones that wait only for observers no live worker has registered. Both need the ``redeliver_transition`` permission, and each is one statement.

*Waiting for* lists the observers a row was noted for that have not run for it yet (a row that
names none is for whichever observers watch it), and marks each one no live worker has
registered: during a rolling deploy a worker of the older release leaves a newer observer's
deliveries alone, and they wait here for a worker of the newer one. A worker is live while its
observer loop's claims keep recording it (``Deliverer``, every 10 s at most): within twice
``OBSERVER_LEASE`` plus 10 s, as a pass may take a lease.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from .. import conf
from ..models import DeliveryState, Transition
from .common import BigintIds, EngineRows, RefuseUnpermittedActions, timestamp
from .databases import OnSelectedDatabase

NO_LIVE_WORKER = "no live worker has this observer registered"

# The observers a row still waits for that no deliverer seen within the window (seconds) has
# registered: one subquery per row shown, over the few rows of backwave_deliverer.
UNSERVED = """
    ARRAY(SELECT name FROM unnest("backwave_transition"."observers") AS o(name)
          WHERE NOT name = ANY("backwave_transition"."delivered_to")
            AND NOT EXISTS (SELECT FROM backwave_deliverer AS d
                            WHERE name = ANY(d.observers) AND d.seen_at > now() - make_interval(secs => %s)))
"""

WAITING = """
    ARRAY(SELECT name FROM unnest("backwave_transition"."observers") AS o(name) WHERE NOT name = ANY("backwave_transition"."delivered_to"))
"""


def live_window() -> float:
    """Seconds since its last recorded claim within which an observer loop counts as live."""
    return 2 * conf.delivery_options().lease + 10.0


@admin.register(Transition)
class TransitionAdmin(OnSelectedDatabase, EngineRows, RefuseUnpermittedActions, BigintIds, admin.ModelAdmin):
    changelist_title = "Transitions waiting for their observers (dead ones first)"
    list_display = (
        "id",
        "state_shown",
        "kind",
        "job_link",
        "attempt_shown",
        "task_path",
        "queue",
        "waiting_shown",
        "deliveries",
        "failed_observer",
        "error_shown",
        "due",
        "occurred",
    )
    list_display_links = ("id",)
    list_filter = ("state", "kind", "queue")
    search_fields = ("task_path", "failed_observer")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["redeliver", "discard"]
    fields = (
        "id",
        "state",
        "kind",
        "job_link",
        "attempt",
        "task_path",
        "queue",
        "occurred_at",
        "deliveries",
        "next_attempt_at",
        "observers",
        "waiting_shown",
        "delivered_to",
        "failed_observer",
        "last_error",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        queryset = super().get_queryset(request).order_by("state", "-id")  # 'dead' sorts before 'pending'
        return queryset.annotate(unserved=RawSQL(UNSERVED, [live_window()]))

    @admin.display(description="waiting for")
    def waiting_shown(self, obj):
        if not obj.observers:
            return format_html('<span class="bw-muted">{}</span>', "any observer that watches it")
        unserved = set(getattr(obj, "unserved", ()))
        return format_html_join(
            mark_safe("<br>"),
            "{}{}",
            (
                (name, format_html(' <strong style="color:#ba2121">({})</strong>', NO_LIVE_WORKER) if name in unserved else "")
                for name in obj.waiting_for
            ),
        )

    def has_redeliver_permission(self, request, obj=None):
        return request.user.has_perm("backwave.redeliver_transition")

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj):
        if obj.state == DeliveryState.DEAD:
            return format_html('<strong style="color:#ba2121">{}</strong>', "dead")
        return obj.state

    @admin.display(description="job", ordering="job_id")
    def job_link(self, obj):
        return format_html('<a href="{}">{}</a>', reverse("admin:backwave_job_change", args=[obj.job_id]), obj.job_id)

    @admin.display(description="attempt", ordering="attempt")
    def attempt_shown(self, obj):
        # A cancel notes the job's attempts so far: 0 for a job no worker ever took (a dependent
        # whose ancestor failed, a job cancelled while it waited), an attempt no job page lists.
        if obj.attempt == 0:
            return format_html('<span class="bw-muted" title="{}">{}</span>', "Cancelled before any attempt", "never ran")
        return obj.attempt

    @admin.display(description="last error")
    def error_shown(self, obj):
        return Truncator(obj.last_error.strip().splitlines()[-1] if obj.last_error.strip() else "").chars(80)

    @admin.display(description="next try", ordering="next_attempt_at")
    def due(self, obj):
        return "-" if obj.state == DeliveryState.DEAD else timestamp(obj.next_attempt_at)

    @admin.display(description="occurred", ordering="occurred_at")
    def occurred(self, obj):
        return timestamp(obj.occurred_at)

    @admin.action(description="Retry delivery now", permissions=["redeliver"])
    def redeliver(self, request, queryset):
        n = queryset.update(state=DeliveryState.PENDING, next_attempt_at=Now(), deliveries=0, claim_token=None)
        messages.success(request, f"{n} transition{'' if n == 1 else 's'} due for delivery now.")

    @admin.action(description="Discard (dead ones, and ones no live worker can deliver)", permissions=["redeliver"])
    def discard(self, request, queryset):
        # A pending row is discarded only when every observer it waits for is registered by no
        # live worker (one removed from the code): any other is still on its way.
        stranded = RawSQL(
            f"cardinality({UNSERVED}) > 0 AND cardinality({UNSERVED}) = cardinality({WAITING})",
            [live_window(), live_window()],
            output_field=BooleanField(),
        )
        n, _ = queryset.alias(stranded=stranded).filter(Q(state=DeliveryState.DEAD) | Q(stranded=True)).delete()
        messages.success(request, f"Discarded {n} transition{'' if n == 1 else 's'}.")

"""Template tags of BackWave's admin pages: the halted-pump banner, the throughput sparkline, the
dashboard and the live-refresh switch.

Django loads every installed app's tag libraries at start-up (the templates' system check), in
projects without ``django.contrib.admin`` too: this module imports the admin package (whose
pages need the admin) only inside the tags that draw admin pages."""

from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html

from ..models import Pump, PumpStatus
from ..ops.stats import Count, humanize_estimate, sparkline_points

register = template.Library()

BANNER_PUMPS_SHOWN = 3


@register.inclusion_tag("admin/backwave/includes/database_switch.html", takes_context=True)
def backwave_database_switch(context):
    """The switch between the databases BackWave's backends use (admin/databases.py), drawn only
    when there are several: every BackWave page shows one of them at a time."""
    from ..admin.databases import selected_database
    from ..databases import console_databases

    request = context.get("request")
    databases = console_databases()
    if request is None or len(databases) < 2 or not request.user.has_module_perms("backwave"):
        return {"databases": []}
    current_app = getattr(request, "current_app", None) or "admin"
    try:
        action = reverse(f"{current_app}:backwave_database_switch")
    except NoReverseMatch:
        return {"databases": []}
    return {
        "databases": databases,
        "selected": selected_database(request),
        "action": action,
        "next": request.get_full_path(),
        "csrf_token": context.get("csrf_token"),
    }


@register.inclusion_tag("admin/backwave/includes/halted_banner.html", takes_context=True)
def backwave_halted_banner(context):
    """The banner every BackWave admin page shows while a pump is halted (one small query), to
    the users who may view pumps (it names them and why they halted)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm("backwave.view_pump"):
        return {"halted": [], "more": False, "pumps_url": ""}
    from ..admin.databases import selected_database

    halted = list(
        Pump.objects.using(selected_database(request))
        .filter(status=PumpStatus.HALTED)
        .only("worker_id", "group", "hostname", "reason")
        .order_by("group", "worker_id")[: BANNER_PUMPS_SHOWN + 1]
    )
    current_app = getattr(request, "current_app", None) or "admin"
    try:
        pumps_url = reverse(f"{current_app}:backwave_pump_changelist")
    except NoReverseMatch:
        pumps_url = ""
    return {
        "halted": halted[:BANNER_PUMPS_SHOWN],
        "more": len(halted) > BANNER_PUMPS_SHOWN,
        "pumps_url": f"{pumps_url}?status__exact=halted" if pumps_url else "",
    }


@register.simple_tag
def backwave_sparkline(values, width=120, height=24):
    """An inline SVG line of per-minute counts (oldest first), drawn here: no JavaScript."""
    total = sum(values)
    peak = max(values) if values else 0
    label = f"{total:,} in the last {len(values)} min, peak {peak:,}/min"
    points = sparkline_points(values, width, height)
    return format_html(
        '<svg class="bw-spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{label}">'
        "<title>{label}</title>"
        '<line x1="0" y1="{base}" x2="{w}" y2="{base}" class="bw-spark-base"/>'
        '<polyline fill="none" points="{points}"/></svg>',
        w=width,
        h=height,
        base=height - 0.5,
        points=points,
        label=label,
    )


@register.filter
def bw_count(count):
    """A bounded count: '1,234', or '10,000+' with the planner's estimate as a tooltip."""
    if not isinstance(count, Count):
        return count
    if not count.capped:
        return str(count)
    estimate = f"planner estimate: about {humanize_estimate(count.estimate)}" if count.estimate else "counted up to the cap"
    return format_html('<span class="bw-capped" title="{}">{}</span>', estimate, str(count))


@register.filter
def bw_time(moment):
    """``timestamp()``'s format with milliseconds (attempts can be milliseconds apart), in Django's
    current zone, which local_times.js can re-show in the browser's zone. One format on every page:
    the year is in the title, as everywhere."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    shown = local.strftime("%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"
    return format_html(
        '<time datetime="{}" data-bw-time data-bw-precise title="{} {}">{}</time>',
        moment.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S"),
        timezone.get_current_timezone_name(),
        shown,
    )


@register.filter
def bw_estimate(count):
    if isinstance(count, Count) and count.capped and count.estimate:
        return f"≈{humanize_estimate(count.estimate)}"
    return ""


@register.inclusion_tag("admin/backwave/includes/dashboard.html", takes_context=True)
def backwave_dashboard(context):
    """The dashboard at the top of the BackWave admin's index (its queries: admin/dashboard.py),
    the parts of it the user may see (dashboard.SECTIONS)."""
    from ..admin import charts, dashboard

    request = context.get("request")
    sections = dashboard.sections_for(getattr(request, "user", None))
    if not sections:
        return {"board": None}
    current_app = getattr(request, "current_app", None) or "admin"
    chosen = dashboard.pick_range(request.GET.get("range") if request is not None else None)
    from ..admin.databases import selected_database

    board = dashboard.build(chosen, using=selected_database(request), sections=sections)
    buckets = board.chart.buckets if board.chart is not None else []

    def url(name):
        try:
            return reverse(f"{current_app}:{name}")
        except NoReverseMatch:
            return ""

    drawn = {}
    if board.chart is not None:
        drawn = {
            "throughput_chart": charts.bar_chart(
                [(start, (ok, bad)) for start, ok, bad in buckets],
                series=[("succeeded", "bw-ok"), ("not succeeded", "bw-bad")],
                resolution=board.chart.resolution,
                title="Finished attempts",
                chart_id="bw-chart-throughput",
            ),
            "failure_chart": charts.bar_chart(
                [(start, (bad,)) for start, _ok, bad in buckets],
                series=[("failed, retried, quarantined or lapsed", "bw-bad")],
                resolution=board.chart.resolution,
                title="Attempts that did not succeed",
                chart_id="bw-chart-failures",
            ),
        }
    return {
        "board": board,
        "ranges": [(name, label) for name, (_s, _r, label) in dashboard.RANGES.items()],
        **drawn,
        "jobs_url": url("backwave_job_changelist"),
        "pumps_url": url("backwave_pump_changelist"),
        "queues_url": url("backwave_queue_changelist"),
        "stats_url": url("backwave_taskstat_changelist"),
        "stuck_factor": dashboard.STUCK_FACTOR,
        "stuck_floor": dashboard.STUCK_FLOOR,
    }


@register.filter
def bw_duration(seconds):
    """0.00042 -> '0.42 ms', 1.5 -> '1.50 s', 125 -> '2 min 5 s', 7300 -> '2 h 1 min'."""
    if seconds is None:
        return "-"
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@register.filter
def bw_percent(fraction):
    if fraction is None:
        return "-"
    return f"{fraction * 100:.1f} %" if fraction < 0.1 else f"{fraction * 100:.0f} %"


@register.inclusion_tag("admin/backwave/includes/live.html")
def backwave_live():
    """The live-refresh switch of a page (static/backwave/live.js): it refreshes every element
    with ``data-bw-live-region`` and an id, every BACKWAVE["ADMIN_REFRESH_SECONDS"] seconds."""
    from .. import conf

    return {"seconds": conf.get_setting("ADMIN_REFRESH_SECONDS")}

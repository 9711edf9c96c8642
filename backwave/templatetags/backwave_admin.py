"""Template tags of BackWave's admin pages: the halted-pump banner and the throughput sparkline."""

from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html

from ..admin.stats import Count, humanize_estimate, sparkline_points
from ..models import Pump, PumpStatus

register = template.Library()

BANNER_PUMPS_SHOWN = 3


@register.inclusion_tag("admin/backwave/includes/halted_banner.html", takes_context=True)
def backwave_halted_banner(context):
    """The banner every BackWave admin page shows while a pump is halted (one small query)."""
    halted = list(
        Pump.objects.filter(status=PumpStatus.HALTED)
        .only("worker_id", "group", "hostname", "reason")
        .order_by("group", "worker_id")[: BANNER_PUMPS_SHOWN + 1]
    )
    request = context.get("request")
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
        w=width, h=height, base=height - 0.5, points=points, label=label,
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
    """A millisecond-precise time in Django's current zone, which local_times.js can re-show in
    the browser's zone."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    shown = local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"
    return format_html(
        '<time datetime="{}" data-bw-time data-bw-precise title="{} {}">{}</time>',
        moment.isoformat(), local.strftime("%Y-%m-%d %H:%M:%S"), timezone.get_current_timezone_name(), shown,
    )


@register.filter
def bw_estimate(count):
    if isinstance(count, Count) and count.capped and count.estimate:
        return f"≈{humanize_estimate(count.estimate)}"
    return ""

"""What every BackWave admin page shares: the rows are the engine's, ids are bigints spelled in
ASCII digits, and an action the user may not run is refused with a 403."""

from __future__ import annotations

import re

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.utils import timezone
from django.utils.html import format_html

MAX_ROW_ID = 2**63 - 1  # Job.id and Schedule.id are bigints
# ASCII only: str.isdigit() also accepts "²" and "٣", which int() refuses or reads as another number.
_ROW_ID_TEXT = re.compile(r"[0-9]{1,19}\Z")


def parse_row_id(text) -> int | None:
    """The id that ``text`` spells in ASCII digits, or None when it names no possible row."""
    if not isinstance(text, str) or not _ROW_ID_TEXT.match(text):
        return None
    row_id = int(text)
    return row_id if 1 <= row_id <= MAX_ROW_ID else None


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
    """A compact, second-precise time in the current time zone (Django's, set by TIME_ZONE or
    timezone.activate()), with the full time and the zone's name on hover. ``data-bw-time``
    lets local_times.js re-show it in the browser's zone."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    return format_html(
        '<time datetime="{}" data-bw-time title="{} {}">{}</time>',
        moment.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S"),
        timezone.get_current_timezone_name(),
        local.strftime("%m-%d %H:%M:%S"),
    )


def timestamp_column(field_name: str, description: str):
    """A ModelAdmin column (list_display or a read-only field) showing ``field_name`` as
    ``timestamp()`` does, sorted by the field: every BackWave page shows times the Jobs page's way,
    never in Django's DATETIME_FORMAT ("Dec. 6, 2026, 1:15 a.m.")."""

    @admin.display(description=description, ordering=field_name)
    def column(self, obj):
        return timestamp(getattr(obj, field_name))

    column.__name__ = f"{field_name}_shown"
    return column


def duration_text(seconds) -> str:
    """A duration an operator reads at a glance: 420 ms, 3.2 s, 4 min 05 s, 2 h 10 min."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} d {hours % 24} h"


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

"""Which database the admin shows: one at a time, chosen with the switch at the top of every
BackWave page and kept in the session.

BackWave's backends may enqueue into different databases (``OPTIONS["DATABASE"]``), and a job, a
queue's row, a pump or a schedule lives in one of them only; ids are per database, so job 7 of
one database is another job than job 7 of the other. Every page and every action therefore
reads and writes the selected database (``selected_database``), never the router's alone. The
choice lists ``console_databases()``: the databases of BackWave's backends, the router's first,
which is also what a session that chose nothing, or chose a database the settings no longer
use, is shown.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.urls import NoReverseMatch, Resolver404, resolve, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from ..databases import console_databases, not_a_console_database

SESSION_KEY = "backwave_database"
# Pages of one row: that row's id means another row (or none) in the other database, so the
# switch goes to the list of the same model instead.
ONE_ROW_PAGES = ("_change", "_history", "_delete", "_bulk")


def selected_database(request) -> str:
    """The database ``request``'s pages read and write: the session's choice when it is one of
    ``console_databases()``, else the first of them (saying so, once, when the choice is stale)."""
    chosen = getattr(request, "_backwave_database", None)
    if chosen is not None:
        return chosen
    databases = console_databases()
    session = getattr(request, "session", None)
    wanted = session.get(SESSION_KEY) if session is not None else None
    chosen = databases[0]
    if wanted in databases:
        chosen = wanted
    elif wanted is not None:
        del session[SESSION_KEY]
        messages.error(request, f"{not_a_console_database(wanted, databases)} Showing {chosen!r}.", fail_silently=True)
    request._backwave_database = chosen
    return chosen


def several_databases() -> bool:
    return len(console_databases()) > 1


@require_POST
def switch_view(request):
    """The switch's POST: keep ``database`` in the session, then back to ``next`` (the list of
    the same rows when ``next`` showed one row)."""
    if not request.user.has_module_perms("backwave"):
        raise PermissionDenied
    databases = console_databases()
    wanted = request.POST.get("database", "")
    if wanted in databases:
        request.session[SESSION_KEY] = wanted
        request._backwave_database = wanted
    else:
        messages.error(request, f"{not_a_console_database(wanted, databases)} Still showing {selected_database(request)!r}.")
    return HttpResponseRedirect(_back(request))


def _back(request) -> str:
    current_app = getattr(request, "current_app", None) or "admin"
    index = reverse(f"{current_app}:index")
    wanted = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return index
    try:
        match = resolve(urlsplit(wanted).path)
    except Resolver404:
        return wanted
    name = match.url_name or ""
    for suffix in ONE_ROW_PAGES:
        if name.startswith("backwave_") and name.endswith(suffix):
            try:
                return reverse(f"{match.namespace or current_app}:{name.removesuffix(suffix)}_changelist")
            except NoReverseMatch:
                return index
    return wanted


class OnSelectedDatabase:
    """ModelAdmin mixin: the page's rows (its list, a row's page, the actions' querysets) come
    from the selected database."""

    def get_queryset(self, request):
        return super().get_queryset(request).using(selected_database(request))

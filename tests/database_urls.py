"""The DATABASE_URL a worker or bin/run subprocess is given for a server the tests reach."""

from __future__ import annotations

from urllib.parse import quote


def database_url(settings: dict, *, user: str | None = None, dbname: str | None = None, options: str | None = None) -> str:
    """``settings`` (a Django DATABASES entry) as a URL the project's settings read back.

    A unix socket directory (the embedded server's) goes in percent-encoded, as libpq's URIs
    have it; so do the credentials. ``user``, ``dbname`` and ``options`` (libpq's startup
    options) replace or add to what ``settings`` names."""
    user = settings["USER"] if user is None else user
    password = settings.get("PASSWORD") or ""
    credentials = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
    host = quote(settings.get("HOST") or "127.0.0.1", safe="")
    url = f"postgres://{credentials}@{host}:{settings.get('PORT') or 5432}/{dbname or settings['NAME']}"
    return url + (f"?options={quote(options)}" if options else "")

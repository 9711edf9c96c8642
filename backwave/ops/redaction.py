"""Hiding sensitive arguments and results from the people who watch jobs.

A job's arguments and return value are stored as they were given: the worker needs them whole.
What an operator sees of them (the admin's pages and search, ``manage.py backwave_jobs`` and
BackWave's own log lines) goes through ``redact`` first, which replaces the value under every
dict key matching ``BACKWAVE["REDACT_KEYS"]`` (a case-insensitive regular expression searched
anywhere in the key, as Django's ``SafeExceptionReporterFilter`` does with setting names) by
``REDACTED``, at any depth. Positional arguments have no key to match: pass secrets as keyword
arguments, or better, pass the id of a row that holds them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from .. import conf

REDACTED = "********************"  # Django's SafeExceptionReporterFilter.cleansed_substitute


@lru_cache(maxsize=8)
def _compiled(pattern: str | None) -> re.Pattern | None:
    return re.compile(pattern, re.IGNORECASE) if pattern else None


def sensitive_pattern() -> re.Pattern | None:
    """BACKWAVE["REDACT_KEYS"], compiled (None: nothing is redacted)."""
    return _compiled(conf.get_setting("REDACT_KEYS"))


def is_sensitive(key: Any) -> bool:
    """Whether the value under dict key ``key`` is hidden."""
    pattern = sensitive_pattern()
    return pattern is not None and isinstance(key, str) and pattern.search(key) is not None


def redact(value: Any) -> Any:
    """``value`` with what is under each sensitive dict key replaced by REDACTED (a copy; the
    value given is left alone). Lists and dicts are walked however deep they nest."""
    pattern = sensitive_pattern()
    if pattern is None:
        return value
    return _redact(value, pattern)


def _redact(value: Any, pattern: re.Pattern) -> Any:
    # Iterative over a stack would be faster for huge values; an admin page shows one payload
    # (capped by MAX_PAYLOAD_BYTES), and JSON decoding already bounds the nesting depth.
    if isinstance(value, dict):
        return {key: REDACTED if isinstance(key, str) and pattern.search(key) else _redact(item, pattern) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact(item, pattern) for item in value]
    return value


def redacted_text(value: Any, limit: int = 200) -> str:
    """A short repr of ``value`` for a log line, sensitive keys hidden."""
    text = repr(redact(value))
    return text if len(text) <= limit else text[:limit] + "…"

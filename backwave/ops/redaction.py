"""Hiding sensitive arguments and results from the people who watch jobs.

A job's arguments and return value are stored as they were given: the worker needs them whole.
What an operator sees of them (the admin's pages and search, ``manage.py backwave_jobs`` and
BackWave's own log lines) goes through ``redact`` first, which replaces the value under every
dict key matching ``BACKWAVE["REDACT_KEYS"]`` (a case-insensitive regular expression searched
anywhere in the key, as Django's ``SafeExceptionReporterFilter`` does with setting names) by
``REDACTED``, at any depth. Positional arguments have no key to match: pass secrets as keyword
arguments, or better, pass the id of a row that holds them.

A job row holds more than its payload that derives from the arguments or the handler: the
uniqueness key (canonical JSON of the chosen arguments), the limit key (one argument's value),
the progress and the metadata the handler reported, the output and the return value. Every
surface shows those through ``redacted(job, field)``, so none shows in clear what the payload
hides. The keys stay whole in the row: the engine compares them.
"""

from __future__ import annotations

import json
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
        return {
            key: REDACTED if isinstance(key, str) and pattern.search(key) else _redact(item, pattern)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact(item, pattern) for item in value]
    return value


def redacted_text(value: Any, limit: int = 200) -> str:
    """A short repr of ``value`` for a log line, sensitive keys hidden."""
    text = repr(redact(value))
    return text if len(text) <= limit else text[:limit] + "…"


# Job fields that hold JSON derived from the call or the handler, redacted key by key.
JSON_FIELDS = frozenset({"payload", "return_value", "output", "progress", "metadata"})
KEY_FIELDS = frozenset({"unique_key", "limit_key"})


def redacted(job, field: str) -> Any:
    """What any surface may show of ``field`` of ``job`` (a Job row): the JSON fields through
    ``redact``; the uniqueness key with the sensitive arguments inside it hidden; the limit key
    hidden when it is the value of a sensitive argument. ValueError for any other field."""
    if field in JSON_FIELDS:
        return redact(getattr(job, field))
    if field == "unique_key":
        return redact_unique_key(job.unique_key, job.task_path)
    if field == "limit_key":
        return redact_limit_key(job.limit_key, job.payload)
    raise ValueError(
        f"{field!r} is not a field derived from a job's arguments; redacted() knows {sorted(JSON_FIELDS | KEY_FIELDS)}"
    )


def redact_unique_key(key: str | None, task_path: str) -> str | None:
    """A stored uniqueness key (``<task path>:<canonical JSON of the chosen arguments>``, then
    ``@<period>s#<window>`` for a key with a period) with the JSON's sensitive values hidden. A
    key given explicitly (``Unique(key=...)``) or hashed (``sha256:...``) is shown as it is."""
    pattern = sensitive_pattern()
    prefix = f"{task_path}:"
    if key is None or pattern is None or not key.startswith(prefix):
        return key
    rest = key[len(prefix) :]
    try:
        arguments, end = json.JSONDecoder().raw_decode(rest)
    except ValueError:
        return key
    if not isinstance(arguments, dict):
        return key
    # The same canonical form the key was made in (tasking.task.unique_key).
    shown = json.dumps(_redact(arguments, pattern), sort_keys=True, separators=(",", ":"))
    return prefix + shown + rest[end:]


def redact_limit_key(key: str | None, payload: Any) -> str | None:
    """A limit key, hidden when it is the text of a value the payload keeps under a sensitive
    key (``limit_by="api_token"``; ``using(limit_by=...)`` may choose the argument per enqueue,
    so the value, not the task's declaration, tells)."""
    if key is None or sensitive_pattern() is None:
        return key
    return REDACTED if key in _sensitive_texts(payload) else key


def _sensitive_texts(value: Any) -> set[str]:
    """The text of every string or integer the payload holds under a sensitive key, at any depth."""
    pattern = sensitive_pattern()
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and pattern.search(key):
                    if isinstance(inner, (str, int)) and not isinstance(inner, bool):
                        found.add(str(inner))
                else:
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)
    return found

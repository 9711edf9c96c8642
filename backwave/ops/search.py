"""The jobs search: what an operator types into the admin's search box or passes to
``manage.py backwave_jobs --search``.

Terms, separated by spaces (a value with spaces goes in quotes: "..." is a JSON string, '...'
plain text; a JSON object or list may hold spaces), all of which must match:

* ``123`` or ``#123``: the job with that id.
* ``key=value``: a keyword argument; ``user.email=a@b.c`` looks inside a dict argument. The
  value is read as JSON when it is JSON (``42``, ``true``, ``null``, ``"42"``, ``[1, 2]``) and as
  text otherwise (``order=42`` is the number, ``order="42"`` the text).
* ``arg:value``: a positional argument equal to value (read as above).
* ``tag:name``: jobs carrying that tag.
* anything else: part of the task's import path.

Argument terms are JSON containment (``payload @> '{"kwargs": {...}}'``), which the GIN index
``backwave_job_payload`` (jsonb_path_ops) serves; tags use ``backwave_job_tags``. A key that
``BACKWAVE["REDACT_KEYS"]`` hides cannot be searched for: a match would tell the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import BooleanField, F, Func, Q, Value
from django.db.models.functions import Cast

from ..models import Job
from .redaction import is_sensitive

MAX_ROW_ID = 2**63 - 1
MAX_TERMS = 10
# Levels of nesting a searched value (or a dotted key path) may have. An argument is rarely more
# than a few levels deep; past this, decoding and encoding the value recurse without bound.
MAX_DEPTH = 32


class SearchError(ValueError):
    """A search the operator must rephrase; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class JobSearch:
    """A parsed search: every part must match."""

    ids: tuple[int, ...] = ()
    payload: tuple[Q, ...] = ()  # one Q per argument term
    tags: tuple[str, ...] = ()
    task_parts: tuple[str, ...] = ()
    impossible: bool = False  # an id no job can have
    terms: tuple[str, ...] = field(default=())

    def apply(self, queryset):
        """``queryset`` narrowed to the jobs that match."""
        if self.impossible:
            return queryset.none()
        for job_id in self.ids:
            queryset = queryset.filter(id=job_id)
        for condition in self.payload:
            queryset = queryset.filter(condition)
        if self.tags:
            queryset = queryset.filter(tags_condition(self.tags))
        for part in self.task_parts:
            queryset = queryset.filter(task_path__icontains=part)
        return queryset


class _Within(Func):
    """``value <@ column``: the containment written from the value's side. The running arm of
    ``contains`` spells it so on purpose: given two arms with the same ``column @> value``,
    PostgreSQL factors it out of the OR, and the partial GIN index no longer matches."""

    template = "(%(expressions)s)"
    arg_joiner = " <@ "
    output_field = BooleanField()


# The predicates of the partial GIN indexes (Job.Meta.indexes), stated as they are so that
# PostgreSQL can prove them: the second conjunct is what no other statement says.
SEARCHABLE = {"payload": ~Q(state="running") & ~Q(payload={}), "tags": ~Q(state="running") & ~Q(tags=[])}


def contains(column: str, value: Any) -> Q:
    """Jobs whose ``column`` (payload or tags) contains ``value``. The GIN indexes leave running
    rows out (a claim then writes no GIN entry), so the rest is read through them, and running
    jobs, at most the jobs in flight, through the partial running-jobs index."""
    field = Job._meta.get_field(column)
    within = _Within(
        Cast(Value(json.dumps(value) if column == "payload" else value), field.__class__(**_cast_options(field))), F(column)
    )
    return (Q(**{f"{column}__contains": value}) & SEARCHABLE[column]) | (Q(within) & Q(state="running"))


def _cast_options(field) -> dict:
    return (
        {"base_field": field.base_field.__class__(max_length=field.base_field.max_length)} if hasattr(field, "base_field") else {}
    )


def tags_condition(tags: Iterable[str]) -> Q:
    """Jobs carrying every one of ``tags``, in the form the partial tags index serves."""
    return contains("tags", list(tags))


def check_text(text: str, what: str) -> str:
    """``text`` when PostgreSQL can compare it, else SearchError naming ``what``: a NUL is the one
    character its text and jsonb refuse (a DataError that would abort the statement)."""
    if "\x00" in text:
        raise SearchError(f"{what} cannot contain a NUL character (\\x00): PostgreSQL stores none, so no job can match.")
    return text


def split_terms(text: str) -> list[str]:
    """Split on spaces outside quotes and brackets, keeping the quotes: ``a="x y" b={"k": 1}``
    is two terms, and a value's quotes still tell a JSON string from a number."""
    terms, current, quote, depth, escaped = [], [], "", 0, False
    for char in text.strip():
        if quote:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char in "\"'":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth = max(depth - 1, 0)
        elif char.isspace() and depth == 0:
            if current:
                terms.append("".join(current))
                current = []
            continue
        current.append(char)
    if quote:
        raise SearchError(f"The search has an unbalanced quote ({quote}): close it, or leave it out.")
    if current:
        terms.append("".join(current))
    return terms


def _value(text: str) -> Any:
    """The JSON value a typed value stands for: itself read as JSON (42, true, "text", an
    object...), else its text; 'single quotes' mean the text inside them."""
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    try:
        value = json.loads(text)
    except RecursionError:
        raise SearchError(f"A searched value cannot nest more than {MAX_DEPTH} levels deep.") from None
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):  # NaN, Infinity: JSON has none
        return text
    _check_value(value)
    return value


def _check_value(value: Any) -> None:
    """A JSON value typed as a search: no hidden key (``{"password": "x"}`` would tell it), no
    NUL (a ``\\u0000`` escape, which jsonb refuses), at most MAX_DEPTH levels."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SearchError(f"A searched value cannot nest more than {MAX_DEPTH} levels deep.")
        if isinstance(item, dict):
            for key, inner in item.items():
                check_text(key, "A searched value")
                if is_sensitive(key):
                    raise SearchError(f"{key!r} is redacted (BACKWAVE['REDACT_KEYS']) and cannot be searched for.")
                stack.append((inner, depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, depth + 1) for inner in item)
        elif isinstance(item, str):
            check_text(item, "A searched value")


def _nested(path: list[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _argument_term(term: str) -> Q:
    key, _, raw = term.partition("=")
    path = key.split(".")
    if not all(path):
        raise SearchError(f"{term!r}: say which argument, e.g. order_id=42 or customer.email=a@example.com.")
    if len(path) > MAX_DEPTH:
        raise SearchError(f"{key[:60]!r}…: a key path cannot be more than {MAX_DEPTH} levels deep.")
    for part in path:
        if is_sensitive(part):
            raise SearchError(f"{key!r} is redacted (BACKWAVE['REDACT_KEYS']) and cannot be searched for.")
    return contains("payload", {"kwargs": _nested(path, _value(raw))})


def parse(text: str) -> JobSearch:
    """The search ``text`` asks for, or SearchError saying why it cannot be run."""
    terms = split_terms(check_text(text, "The search"))
    if len(terms) > MAX_TERMS:
        raise SearchError(f"At most {MAX_TERMS} search terms, got {len(terms)}.")
    ids, payload, tags, task_parts = [], [], [], []
    impossible = False
    for term in terms:
        bare = term.lstrip("#")
        if bare and bare.isascii() and bare.isdigit():
            job_id = int(bare) if len(bare) <= 19 else 0
            if 1 <= job_id <= MAX_ROW_ID:
                ids.append(job_id)
            else:
                impossible = True
        elif term.startswith("tag:"):
            if not term[4:]:
                raise SearchError("'tag:' needs a tag, e.g. tag:tenant-7.")
            tags.append(term[4:])
        elif term.startswith("arg:"):
            payload.append(contains("payload", {"args": [_value(term[4:])]}))
        elif "=" in term:
            payload.append(_argument_term(term))
        elif term.strip("#"):
            task_parts.append(term)
        else:
            impossible = True  # "#" alone, or a digit int() reads but ASCII does not spell
    return JobSearch(
        ids=tuple(ids),
        payload=tuple(payload),
        tags=tuple(tags),
        task_parts=tuple(task_parts),
        impossible=impossible,
        terms=tuple(terms),
    )

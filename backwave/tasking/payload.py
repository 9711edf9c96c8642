"""The job payload codec: ``{"args": [...], "kwargs": {...}}`` as JSON, checked so that what the
worker decodes is exactly what the caller passed (no silent ``default=`` conversion, no NaN, no
non-string keys, no NUL or lone surrogate that jsonb would refuse mid-transaction), and no larger
than the limit. Every refusal is an ``InvalidTask`` with the path to the offending value; one of
arguments that are not plain JSON is ``InvalidArguments``, also the ``TypeError`` Django's
contract raises there, opening with Django's own sentence when a type is at fault.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from django.tasks.exceptions import InvalidTask

from ..store.storable import text_problem

MAX_JSON_DEPTH = 500  # only bounds the error-path walk; json.dumps has its own recursion limit


class InvalidArguments(InvalidTask, TypeError):
    """A task's arguments are not plain JSON. An ``InvalidTask`` for BackWave's callers, and the
    ``TypeError`` that Django's contract raises (``normalize_json``'s "Unsupported type: ...")."""


InvalidArguments.__module__ = "backwave"


def type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _trail_text(trail) -> str:
    parts = []
    while trail is not None:
        trail, key = trail
        parts.append(f"[{key!r}]" if trail is not None else key)
    return "".join(reversed(parts))


def json_problem(value, root: str) -> str | None:
    """Describe the first thing in ``value`` that would not come back from JSON as it went in."""
    found = _first_problem(value, root)
    return found[0] if found else None


def _first_problem(value, root: str) -> tuple[str, type | None] | None:
    """json_problem's text, and the type at fault when it is a type JSON has not (else None)."""
    stack = [(value, (None, root), 0)]
    while stack:
        item, trail, depth = stack.pop()
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{_trail_text(trail)} is {item!r}, which JSON cannot represent", None
        elif isinstance(item, str):
            if problem := text_problem(item):
                return f"{_trail_text(trail)} contains {problem}, which PostgreSQL's jsonb cannot store", None
        elif depth >= MAX_JSON_DEPTH:
            return f"{_trail_text(trail)} is nested more than {MAX_JSON_DEPTH} levels deep", None
        elif isinstance(item, (list, tuple)):
            stack.extend((child, (trail, index), depth + 1) for index, child in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{_trail_text(trail)} has the key {key!r} ({type_name(key)}); JSON object keys must be strings", None
                if problem := text_problem(key):
                    return f"{_trail_text(trail)} has a key with {problem}, which PostgreSQL's jsonb cannot store", None
                children.append((child, (trail, key), depth + 1))
            stack.extend(reversed(children))
        else:
            return f"{_trail_text(trail)} is a {type_name(item)}, which is not JSON", type(item)
    return None


def encode_payload(task, args, kwargs, *, max_bytes: int) -> dict[str, Any]:
    """The job payload ``{"args": [...], "kwargs": {...}}``, or InvalidTask if it is not plain
    JSON or its encoding is larger than ``max_bytes``."""
    path = task.module_path
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Sequence):
        raise InvalidArguments(f"args for task {path!r} must be a list or tuple, got {type_name(args)}.")
    if not isinstance(kwargs, Mapping):
        raise InvalidArguments(f"kwargs for task {path!r} must be a dict, got {type_name(kwargs)}.")
    payload = {"args": list(args), "kwargs": dict(kwargs)}
    culprit = None  # the type JSON has not, for Django's sentence
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except RecursionError:
        problem = "the arguments are nested too deeply"
    except (TypeError, ValueError) as exc:
        if "ircular" in str(exc):
            problem = "the arguments refer to themselves"
        else:
            problem, culprit = _first_problem(payload, "payload") or (str(exc), None)
    else:
        # Fast path: the round trip gives back an equal value and no \u escape (a NUL or a lone
        # surrogate, which jsonb refuses, can only hide behind one). Only otherwise walk it (a
        # non-string key, a NUL, a surrogate, or just a tuple or a non-ASCII letter, which are fine).
        same = "\\u" not in encoded and json.loads(encoded) == payload
        problem = None if same else json_problem(payload, "payload")
    if problem:
        opening = f"Unsupported type: {culprit}. " if culprit is not None else ""
        raise InvalidArguments(
            f"{opening}Arguments of task {path!r} must be plain JSON (str, int, float, bool, None, lists, dicts "
            f"with string keys): {problem}. Pass an id or an ISO string instead of an object."
        )
    if len(encoded) > max_bytes:  # ensure_ascii: one character is one byte
        raise InvalidTask(
            f"Arguments of task {path!r} encode to {len(encoded):,} bytes of JSON; the limit is {max_bytes:,} "
            "(MAX_PAYLOAD_BYTES). Store large data elsewhere and pass its id."
        )
    return payload

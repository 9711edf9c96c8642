"""BackWave's settings, with their defaults, in one place.

Project-wide values come from ``settings.BACKWAVE`` (a dict); a TASKS backend may override the
per-backend ones in its ``OPTIONS``::

    BACKWAVE = {"DEFAULT_MAX_ATTEMPTS": 5, "TASK_MODULES": ["shop.jobs"]}
    TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend",
                         "OPTIONS": {"DATABASE": "default", "MAX_PAYLOAD_BYTES": 65_536}}}

Values are read on every call (a dict lookup), so ``override_settings`` and pytest-django's
``settings`` fixture take effect at once. An unknown key or a value of the wrong kind raises
``ImproperlyConfigured`` naming the key, the value and what is allowed; ``backwave/checks.py``
reports the same problems as system checks.

Why ``DEFAULT_MAX_ATTEMPTS`` is 3 and not 1: attempts are counted when a job is claimed, so a job
whose worker is killed (a deploy's SIGKILL, the OOM killer) has used an attempt. With one attempt
such a job would be dead instead of running again once the lease lapses, breaking the "a killed
worker's jobs run again" promise. Three attempts, one and two seconds apart by default, also ride
out a deadlock or a network blip without an operator, yet a broken task still fails within
seconds instead of retrying for hours. Execution is at-least-once anyway, so retries ask nothing
new of a task: it must already be idempotent.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULTS: dict[str, Any] = {
    "MAX_PAYLOAD_BYTES": 1024 * 1024,  # the {"args", "kwargs"} JSON, encoded
    "DEFAULT_MAX_ATTEMPTS": 3,  # see the module docstring
    "DEFAULT_BACKOFF_BASE": 1.0,  # seconds before the first retry; doubles per attempt
    "DEFAULT_BACKOFF_MAX": 3600.0,  # cap on one retry's delay, seconds
    "TASK_MODULES": [],  # extra modules the worker imports to discover tasks
    "WORKER_GROUPS": [],  # list of dicts, validated by the worker (WorkerGroupOptions)
    "MAX_TRACEBACK_CHARS": 16_000,  # a stored traceback keeps its last this-many characters
    # The worker's own bookkeeping (claims, outcomes, leases) commits without waiting for the
    # WAL flush. Only a crash of the PostgreSQL server itself can lose the last few hundred
    # milliseconds of it, and what it loses is re-run (at-least-once) and still fenced
    # (effect-once): a lost claim makes the job ready again, a lost outcome leaves the job under
    # a lease that lapses. Enqueues keep the application's own setting. True restores the
    # flush-per-commit at about a fifth of the throughput on an ordinary disk.
    "WORKER_SYNCHRONOUS_COMMIT": False,
}

# Keys a TASKS backend's OPTIONS may carry: its database alias plus the enqueue-side values.
BACKEND_OPTION_DEFAULTS: dict[str, Any] = {"DATABASE": "default"}
BACKEND_OVERRIDABLE = ("MAX_PAYLOAD_BYTES", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_BACKOFF_BASE", "DEFAULT_BACKOFF_MAX")
BACKEND_OPTION_NAMES = (*BACKEND_OPTION_DEFAULTS, *BACKEND_OVERRIDABLE)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(minimum: int) -> Callable[[Any], str | None]:
    def check(value):
        if not _is_int(value) or value < minimum:
            return f"an integer >= {minimum}"
        return None

    return check


def _seconds(value) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        return "a finite number of seconds >= 0"
    return None


def _list_of(kind: type, label: str) -> Callable[[Any], str | None]:
    def check(value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, kind) for item in value):
            return f"a list of {label}"
        return None

    return check


def _alias(value) -> str | None:
    if not isinstance(value, str) or not value:
        return "a database alias (a non-empty string)"
    return None


# Each validator returns None for a good value, else what is allowed ("an integer >= 1").
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "MAX_PAYLOAD_BYTES": _int_at_least(1),
    "DEFAULT_MAX_ATTEMPTS": _int_at_least(1),
    "DEFAULT_BACKOFF_BASE": _seconds,
    "DEFAULT_BACKOFF_MAX": _seconds,
    "TASK_MODULES": _list_of(str, "dotted module paths (strings)"),
    "WORKER_GROUPS": _list_of(dict, "dicts (one per worker group)"),
    "MAX_TRACEBACK_CHARS": _int_at_least(0),
    "WORKER_SYNCHRONOUS_COMMIT": lambda value: None if isinstance(value, bool) else "True or False",
    "DATABASE": _alias,
}


def unknown_key_message(key, allowed, where: str) -> str:
    """Name an unknown key, suggest the closest allowed one and list them all."""
    suggestion = difflib.get_close_matches(str(key), list(allowed), n=1)
    hint = f" Did you mean {suggestion[0]!r}?" if suggestion else ""
    return f"{where} has an unknown key {key!r}.{hint} Allowed keys: {', '.join(sorted(allowed))}."


def value_problem(name: str, value, where: str) -> str | None:
    """A sentence describing why ``value`` is not acceptable for ``name``, or None when it is."""
    allowed = VALIDATORS[name](value)
    if allowed is None:
        return None
    return f"{where}[{name!r}] must be {allowed}, got {value!r}."


def settings_problems() -> list[str]:
    """Every problem with ``settings.BACKWAVE``, as sentences (empty when it is fine)."""
    user = getattr(settings, "BACKWAVE", {})
    if not isinstance(user, Mapping):
        return [f"settings.BACKWAVE must be a dict, got {type(user).__name__}."]
    problems = [unknown_key_message(key, DEFAULTS, "settings.BACKWAVE") for key in user if key not in DEFAULTS]
    for name, value in user.items():
        if name in DEFAULTS and (problem := value_problem(name, value, "BACKWAVE")):
            problems.append(problem)
    return problems


def options_problems(options, where: str) -> list[str]:
    """Every problem with a TASKS backend's OPTIONS dict (``where`` names it in messages)."""
    if not isinstance(options, Mapping):
        return [f"{where} must be a dict, got {type(options).__name__}."]
    problems = [unknown_key_message(key, BACKEND_OPTION_NAMES, where) for key in options if key not in BACKEND_OPTION_NAMES]
    for name, value in options.items():
        if name in BACKEND_OPTION_NAMES and (problem := value_problem(name, value, where)):
            problems.append(problem)
    return problems


def get_setting(name: str, options: Mapping | None = None, *, where: str = "OPTIONS"):
    """The value of BackWave setting ``name``: a backend's ``options`` first, then
    ``settings.BACKWAVE``, then the default. Raises ImproperlyConfigured on a bad configuration."""
    if name not in DEFAULTS and name not in BACKEND_OPTION_DEFAULTS:
        raise ImproperlyConfigured(unknown_key_message(name, [*DEFAULTS, *BACKEND_OPTION_DEFAULTS], "BackWave's settings"))
    if options and name in options:
        if name not in BACKEND_OPTION_NAMES:
            raise ImproperlyConfigured(unknown_key_message(name, BACKEND_OPTION_NAMES, where))
        value = options[name]
        if problem := value_problem(name, value, where):
            raise ImproperlyConfigured(problem)
        return value
    if name in BACKEND_OPTION_DEFAULTS:
        return BACKEND_OPTION_DEFAULTS[name]
    user = getattr(settings, "BACKWAVE", {})
    if not isinstance(user, Mapping) or any(key not in DEFAULTS for key in user):
        raise ImproperlyConfigured(settings_problems()[0])
    if name not in user:
        return DEFAULTS[name]
    value = user[name]
    if problem := value_problem(name, value, "BACKWAVE"):
        raise ImproperlyConfigured(problem)
    return value

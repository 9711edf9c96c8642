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
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .core.backoff import MAX_DELAY
from .core.options import Retention, WorkerGroupConfigError, WorkerGroupOptions, validate_groups
from .core.policy import Strict, Weighted
from .queue_rules import MAX_CONCURRENCY_LIMIT, QUEUE_NAME_RULE, is_concurrency_limit, is_queue_name

if TYPE_CHECKING:
    from .store.contract import ScheduleDefinition
    from .tasking.registry import TaskRegistry

DEFAULTS: dict[str, Any] = {
    "MAX_PAYLOAD_BYTES": 1024 * 1024,  # the {"args", "kwargs"} JSON, encoded
    # A task's return value, as JSON: a larger one fails its attempt (backwave.UnstorableResult),
    # since every outcome write carries it and every result read loads it.
    "MAX_RESULT_BYTES": 1024 * 1024,
    "DEFAULT_MAX_ATTEMPTS": 3,  # see the module docstring
    "DEFAULT_BACKOFF_BASE": 1.0,  # seconds before the first retry; doubles per attempt
    "DEFAULT_BACKOFF_MAX": 3600.0,  # cap on one retry's delay, seconds
    "TASK_MODULES": [],  # extra modules the worker imports to discover tasks
    "WORKER_GROUPS": [],  # list of dicts, validated by the worker (WorkerGroupOptions)
    "MAX_TRACEBACK_CHARS": 16_000,  # a stored traceback keeps its last this-many characters
    # Seconds a worker's handler thread keeps a Django connection open between attempts when its
    # DATABASES entry leaves CONN_MAX_AGE at Django's default 0. A handler thread is not a web
    # request: closing after every attempt would open one PostgreSQL session per job.
    "WORKER_CONN_MAX_AGE": 600.0,
    # True: the worker's own bookkeeping (claims, outcomes, leases) commits as durably as the
    # database is configured to (BackWave leaves synchronous_commit alone). False: it commits
    # without waiting for the WAL flush, set per transaction (SET LOCAL, PgBouncer-safe); only a
    # crash of the PostgreSQL server itself can then lose its last few hundred milliseconds, and
    # what it loses is re-run (at-least-once) and still fenced (effect-once). Measured with
    # bench/throughput.py it gains little on an ordinary disk (see the docs' benchmarks), so durable is the
    # default. Enqueues always keep the application's own setting.
    "WORKER_SYNCHRONOUS_COMMIT": True,
    # Seconds every statement of a worker's store may run, and wait for a lock, before it fails
    # as a transient fault (SQLSTATE 57014, 55P03). None derives them from the shortest lease of
    # the groups the worker runs: a fifth of it for a statement (6 s at the default 30 s lease),
    # a third of that for a lock wait (2 s). A value given must be at most half the shortest
    # lease, the lock timeout at most the statement timeout (checked at worker start and by
    # `manage.py check`). Set per transaction, so the session's own values stay as they are.
    "WORKER_STATEMENT_TIMEOUT": None,
    "WORKER_LOCK_TIMEOUT": None,
    # Recurring jobs, by name: {"nightly": {"task": "shop.tasks.report", "cron": "0 3 * * *"}}.
    # Keys: task (wire name of a registered task) and cron (5 fields, or 6 with seconds last,
    # evaluated in settings.TIME_ZONE against the database clock), optionally args, kwargs,
    # queue, priority, max_attempts, enabled. Workers sync them to the Schedule table at start.
    "SCHEDULES": {},
    # Queue settings a worker writes to the queues' rows at start-up (the admin and
    # `manage.py backwave_queue` change them at run time): {"reports": {"concurrency_limit": 2}}.
    "QUEUES": {},
    # Seconds to keep finished jobs per final state, and silent pumps' health rows; None keeps
    # them for ever. Keys left out keep their default (core.options.Retention).
    "RETENTION": {},
    # Transition observers (backwave/observers.py): tries per transition before it is left dead
    # (the admin retries it), the backoff between tries (doubling from the base, half-jittered),
    # how long one claimed pass may take before another worker may claim its transitions again,
    # transitions per pass, and the wait between passes while none are due.
    "OBSERVER_MAX_DELIVERIES": 8,
    "OBSERVER_BACKOFF_BASE": 1.0,
    "OBSERVER_BACKOFF_MAX": 600.0,
    "OBSERVER_LEASE": 60.0,
    "OBSERVER_BATCH": 32,
    "OBSERVER_POLL_INTERVAL": 1.0,
    # Seconds between the refreshes of the admin's live pages (dashboard, queues, pumps, jobs);
    # 0 turns them off. A page never refreshes while rows are selected or a field has focus.
    "ADMIN_REFRESH_SECONDS": 5,
    # A regular expression (case-insensitive, searched anywhere in the key): arguments and results
    # under a matching dict key are shown as REDACTED in the admin, `manage.py backwave_jobs` and
    # BackWave's log lines, and cannot be searched for (backwave/ops/redaction.py). Django's
    # SafeExceptionReporterFilter does the same to settings. None or "" redacts nothing.
    "REDACT_KEYS": r"pass(word|wd|phrase)?|secret|token|api[-_]?key|authori[sz]ation|credential|private[-_]?key|signature|cookie|session",
    # The bearer token a Prometheus scraper sends to the Django metrics view (backwave.urls):
    # "Authorization: Bearer <token>". None: only signed-in staff with backwave.view_job may read it.
    "METRICS_TOKEN": None,
    # The DATABASES alias whose connection a worker's wake-up hint listener (LISTEN) uses, per
    # served database: {"default": "default_direct"}. For a database reached through a
    # transaction-pooling PgBouncer, whose pooled sessions cannot hold a LISTEN: name an alias
    # that reaches the same PostgreSQL database directly. Unlisted databases listen on their own.
    "HINT_DATABASES": {},
    # Row versions of the job table changed outside HOT (a claim, an outcome, a purge) after which
    # a worker vacuums the table itself, or 2% of its rows when that is more: each claim leaves a
    # dead entry at the front of the claim index, walked by every claim after it until a vacuum
    # (autovacuum may be off, and by default waits for 20% of the rows). One session per worker
    # process and database (backwave/shell/vacuum.py). None leaves the table to autovacuum.
    "VACUUM_JOB_TABLE_AFTER": 20_000,
}

# The defaults are Retention's own (backwave/core/options.py), so they are written down once.
RETENTION_DEFAULTS: dict[str, float | None] = {f.name: f.default for f in fields(Retention)}

SCHEDULE_KEYS = ("task", "cron", "args", "kwargs", "queue", "priority", "max_attempts", "enabled")
MAX_SCHEDULE_NAME_LENGTH = 100  # Schedule.name

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


def _delay(value) -> str | None:
    """A backoff's base or cap: seconds up to MAX_DELAY, the longest any retry waits."""
    if _seconds(value) or value > MAX_DELAY:
        return f"a finite number of seconds >= 0 and at most {MAX_DELAY:,.0f} (a year)"
    return None


def _positive_seconds_or_none(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        return "a finite number of seconds above 0, or None (derived from the lease)"
    return None


def _list_of(kind: type, label: str) -> Callable[[Any], str | None]:
    def check(value):
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, kind) for item in value):
            return f"a list of {label}"
        return None

    return check


def _pattern_or_none(value) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return "a regular expression (a string), or None to redact nothing"
    try:
        re.compile(value)
    except re.error as error:
        return Sentence(f"['REDACT_KEYS'] is not a valid regular expression ({error}): {value!r}.")
    return None


MIN_METRICS_TOKEN_LENGTH = 24


def _metrics_token(value) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) < MIN_METRICS_TOKEN_LENGTH
        or value != value.strip()
        or not value.isprintable()
        or " " in value
    ):
        # A Sentence, so the message never repeats the value: it is meant to be a secret.
        return Sentence(
            f"['METRICS_TOKEN'] must be None or a secret of at least {MIN_METRICS_TOKEN_LENGTH} printable characters without"
            f" spaces, such as secrets.token_urlsafe(32) read from the environment; got {type(value).__name__}"
            + (f" ({len(value)} characters)." if isinstance(value, str) else ".")
        )
    return None


def _hint_databases(value) -> str | None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return "a dict of DATABASES alias -> DATABASES alias, e.g. {'default': 'default_direct'}"
    for served, direct in value.items():
        for alias in (served, direct):
            if alias not in settings.DATABASES:
                suggestion = difflib.get_close_matches(alias, list(settings.DATABASES), n=1)
                hint = f" Did you mean {suggestion[0]!r}?" if suggestion else ""
                return Sentence(f"['HINT_DATABASES'] names {alias!r}, which is not an alias of DATABASES.{hint}")
    return None


def _alias(value) -> str | None:
    if not isinstance(value, str) or not value:
        return "a database alias (a non-empty string)"
    return None


class Sentence(str):
    """A validator's answer that is a whole sentence about the value, not just what is allowed."""


def _retention(value) -> str | None:
    if not isinstance(value, Mapping):
        return f"a dict with some of the keys {', '.join(RETENTION_DEFAULTS)}"
    for key, seconds in value.items():
        if key not in RETENTION_DEFAULTS:
            return Sentence(unknown_key_message(key, RETENTION_DEFAULTS, "['RETENTION']"))
        if seconds is not None and _seconds(seconds):
            return Sentence(
                f"['RETENTION'][{key!r}] must be a finite number of seconds >= 0 or None (keep for ever), got {seconds!r}."
            )
    return None


def cron_problem(expression) -> str | None:
    """Why ``expression`` is not a cron expression BackWave accepts, or None when it is."""
    from croniter import croniter

    if not isinstance(expression, str) or not expression.strip():
        return "must be a cron expression (a string such as '*/5 * * * *')"
    fields = expression.split()
    if not expression.startswith("@") and len(fields) not in (5, 6):
        return f"has {len(fields)} fields; use 5 (minute hour day month weekday) or 6 (with seconds last)"
    if not croniter.is_valid(expression):
        return "is not a valid cron expression (minute hour day month weekday, e.g. '*/5 * * * *')"
    return None


def _schedule_problem(name, spec) -> str | None:
    where = f"['SCHEDULES'][{name!r}]"
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_SCHEDULE_NAME_LENGTH:
        return f"['SCHEDULES'] keys are schedule names (1 to {MAX_SCHEDULE_NAME_LENGTH} characters), got {name!r}."
    if not isinstance(spec, Mapping):
        return f"{where} must be a dict with 'task' and 'cron', got {spec!r}."
    for key in spec:
        if key not in SCHEDULE_KEYS:
            return unknown_key_message(key, SCHEDULE_KEYS, where)
    for key in ("task", "cron"):
        if key not in spec:
            return f"{where} needs {key!r} ({'the wire name of a task, e.g. shop.tasks.report' if key == 'task' else 'a cron expression, e.g. */5 * * * *'})."
    if not isinstance(spec["task"], str) or not spec["task"]:
        return f"{where}['task'] must be a task's wire name (its dotted import path), got {spec['task']!r}."
    if problem := cron_problem(spec["cron"]):
        return f"{where}['cron'] {problem}, got {spec['cron']!r}."
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    if not isinstance(args, (list, tuple)):
        return f"{where}['args'] must be a list, got {args!r}."
    if not isinstance(kwargs, Mapping):
        return f"{where}['kwargs'] must be a dict, got {kwargs!r}."
    if "queue" in spec and not is_queue_name(spec["queue"]):
        return f"{where}['queue'] must be {QUEUE_NAME_RULE}, got {spec['queue']!r}."
    if "priority" in spec and (not _is_int(spec["priority"]) or not -100 <= spec["priority"] <= 100):
        return f"{where}['priority'] must be an integer from -100 to 100, got {spec['priority']!r}."
    if "max_attempts" in spec and (not _is_int(spec["max_attempts"]) or spec["max_attempts"] < 1):
        return f"{where}['max_attempts'] must be an integer >= 1, got {spec['max_attempts']!r}."
    if "enabled" in spec and not isinstance(spec["enabled"], bool):
        return f"{where}['enabled'] must be True or False, got {spec['enabled']!r}."
    return None


def _schedules(value) -> str | None:
    if not isinstance(value, Mapping):
        return "a dict of schedules by name, e.g. {'nightly': {'task': 'shop.tasks.report', 'cron': '0 3 * * *'}}"
    for name, spec in value.items():
        if problem := _schedule_problem(name, spec):
            return Sentence(problem)
    return None


def _queues(value) -> str | None:
    if not isinstance(value, Mapping):
        return "a dict of queue settings by queue name, e.g. {'reports': {'concurrency_limit': 2, 'paused': False}}"
    for name, spec in value.items():
        where = f"['QUEUES'][{name!r}]"  # value_problem puts the setting's name in front
        if not is_queue_name(name):
            return Sentence(f"['QUEUES'] has the queue name {name!r}; use {QUEUE_NAME_RULE}.")
        if not isinstance(spec, Mapping):
            return Sentence(f"{where} must be a dict with any of {', '.join(QUEUE_KEYS)}, got {spec!r}.")
        unknown = set(spec) - set(QUEUE_KEYS)
        if unknown:
            key = sorted(unknown, key=str)[0]
            close = _queue_key_guess(str(key))
            hint = f"Did you mean {close[0]!r}? " if close else ""
            return Sentence(f"{where} has an unknown key {key!r}. {hint}Allowed keys: {', '.join(QUEUE_KEYS)}.")
        for name in ("concurrency_limit", "key_concurrency_limit", "rate_limit", "key_rate_limit"):
            limit = spec.get(name)
            if limit is not None and not is_concurrency_limit(limit):
                return Sentence(
                    f"{where}[{name!r}] must be a whole number >= 1 (at most {MAX_CONCURRENCY_LIMIT:,}) or None (unlimited), got {limit!r}."
                )
        period = spec.get("rate_period")
        if period is not None and (
            isinstance(period, bool) or not isinstance(period, (int, float)) or not math.isfinite(period) or period <= 0
        ):
            return Sentence(
                f"{where}['rate_period'] must be a number of seconds above 0 (the rate limit's window), got {period!r}."
            )
        if period is not None and spec.get("rate_limit") is None and spec.get("key_rate_limit") is None:
            return Sentence(
                f"{where} sets 'rate_period' ({period!r}) without 'rate_limit' or 'key_rate_limit'; set both, e.g. {{'rate_limit': 50, 'rate_period': 1}}."
            )
        if "paused" in spec and not isinstance(spec["paused"], bool):
            return Sentence(f"{where}['paused'] must be True or False, got {spec['paused']!r}.")
    return None


def _queue_key_guess(text: str) -> list[str]:
    """The QUEUES key a misspelt one most likely meant: by the words it has, else by spelling."""
    words = [
        ("period", "rate_period"),
        ("key_rate", "key_rate_limit"),
        ("rate", "rate_limit"),
        ("key", "key_concurrency_limit"),
        ("limit", "concurrency_limit"),
        ("paus", "paused"),
    ]
    from difflib import get_close_matches

    return next(([key] for word, key in words if word in text.lower()), None) or get_close_matches(text, QUEUE_KEYS, n=1)


# BACKWAVE["QUEUES"] keys: concurrency_limit and paused are written when named (the admin may
# change them); the admission keys are the settings' alone (see admission_limits).
QUEUE_KEYS = ("concurrency_limit", "paused", "key_concurrency_limit", "rate_limit", "key_rate_limit", "rate_period")
DEFAULT_RATE_PERIOD = 1.0


def admission_limits(spec: Mapping) -> dict[str, Any]:
    """The Queue row's admission columns for a validated QUEUES entry (None: no such limit)."""
    rated = spec.get("rate_limit") is not None or spec.get("key_rate_limit") is not None
    return {
        "key_concurrency_limit": spec.get("key_concurrency_limit"),
        "rate_limit": spec.get("rate_limit"),
        "key_rate_limit": spec.get("key_rate_limit"),
        "rate_period": float(spec.get("rate_period") or DEFAULT_RATE_PERIOD) if rated else None,
    }


def admitted_queue_names(settings_queues: Mapping[str, Mapping] | None = None) -> frozenset[str]:
    """The queues under a per-key concurrency or rate limit: claimed with claim_jobs_admitted."""
    if settings_queues is None:
        settings_queues = get_setting("QUEUES")
    return frozenset(
        name for name, spec in settings_queues.items() if any(value is not None for value in admission_limits(spec).values())
    )


# Each validator returns None for a good value, else what is allowed ("an integer >= 1"), or a
# Sentence about the value when that says more (a nested key of SCHEDULES or RETENTION).
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "MAX_PAYLOAD_BYTES": _int_at_least(1),
    "MAX_RESULT_BYTES": _int_at_least(1),
    "DEFAULT_MAX_ATTEMPTS": _int_at_least(1),
    "DEFAULT_BACKOFF_BASE": _delay,
    "DEFAULT_BACKOFF_MAX": _delay,
    "TASK_MODULES": _list_of(str, "dotted module paths (strings)"),
    "WORKER_GROUPS": _list_of(dict, "dicts (one per worker group)"),
    "MAX_TRACEBACK_CHARS": _int_at_least(0),
    "WORKER_CONN_MAX_AGE": _seconds,
    "WORKER_SYNCHRONOUS_COMMIT": lambda value: None if isinstance(value, bool) else "True or False",
    "WORKER_STATEMENT_TIMEOUT": _positive_seconds_or_none,
    "WORKER_LOCK_TIMEOUT": _positive_seconds_or_none,
    "SCHEDULES": _schedules,
    "QUEUES": _queues,
    "RETENTION": _retention,
    "OBSERVER_MAX_DELIVERIES": _int_at_least(1),
    "OBSERVER_BACKOFF_BASE": _delay,
    "OBSERVER_BACKOFF_MAX": _delay,
    "OBSERVER_LEASE": lambda value: (
        _positive_seconds_or_none(value) if value is not None else "a finite number of seconds above 0"
    ),
    "OBSERVER_BATCH": _int_at_least(1),
    "OBSERVER_POLL_INTERVAL": lambda value: (
        _positive_seconds_or_none(value) if value is not None else "a finite number of seconds above 0"
    ),
    "ADMIN_REFRESH_SECONDS": _int_at_least(0),
    "REDACT_KEYS": _pattern_or_none,
    "METRICS_TOKEN": _metrics_token,
    "HINT_DATABASES": _hint_databases,
    "VACUUM_JOB_TABLE_AFTER": lambda value: (
        None if value is None or (_is_int(value) and value >= 1) else "an integer >= 1, or None (autovacuum alone)"
    ),
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
    if isinstance(allowed, Sentence):
        return f"{where}{allowed}"
    return f"{where}[{name!r}] must be {allowed}, got {value!r}."


def backoff_problem(base, cap, *, base_label: str, cap_label: str) -> str | None:
    """Why a backoff cap below its base is refused, or None; each label names its value and
    where it came from. Values of the wrong kind are left to their own validators."""
    if _seconds(base) or _seconds(cap) or cap >= base:
        return None
    return f"{cap_label} must be at least {base_label}: it caps every retry's delay, the first one included."


def default_backoff_problem(options: Mapping | None = None, where: str = "OPTIONS") -> str | None:
    """Why the default backoff cap is below the default base (a backend's ``options`` over
    BACKWAVE over the defaults), or None."""
    user = getattr(settings, "BACKWAVE", {})
    if not isinstance(user, Mapping):
        return None
    values, labels = {}, {}
    for name in ("DEFAULT_BACKOFF_BASE", "DEFAULT_BACKOFF_MAX"):
        if isinstance(options, Mapping) and name in options:
            values[name], origin, note = options[name], f"{where}[{name!r}]", ""
        else:
            values[name], origin, note = (
                user.get(name, DEFAULTS[name]),
                f"BACKWAVE[{name!r}]",
                "" if name in user else ", its default",
            )
        labels[name] = f"{origin} ({values[name]:g} s{note})" if not _seconds(values[name]) else origin
    return backoff_problem(
        values["DEFAULT_BACKOFF_BASE"],
        values["DEFAULT_BACKOFF_MAX"],
        base_label=labels["DEFAULT_BACKOFF_BASE"],
        cap_label=labels["DEFAULT_BACKOFF_MAX"],
    )


def retention() -> dict[str, float | None]:
    """BACKWAVE["RETENTION"] over its defaults: every key, in seconds or None."""
    return {**RETENTION_DEFAULTS, **get_setting("RETENTION")}


def settings_problems() -> list[str]:
    """Every problem with ``settings.BACKWAVE``, as sentences (empty when it is fine)."""
    user = getattr(settings, "BACKWAVE", {})
    if not isinstance(user, Mapping):
        return [f"settings.BACKWAVE must be a dict, got {type(user).__name__}."]
    problems = [unknown_key_message(key, DEFAULTS, "settings.BACKWAVE") for key in user if key not in DEFAULTS]
    for name, value in user.items():
        if name in DEFAULTS and (problem := value_problem(name, value, "BACKWAVE")):
            problems.append(problem)
    if problem := default_backoff_problem():
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
    # Only when the backend sets one of them: BACKWAVE's own pair is settings_problems'.
    if {"DEFAULT_BACKOFF_BASE", "DEFAULT_BACKOFF_MAX"} & options.keys() and (problem := default_backoff_problem(options, where)):
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


# --- worker groups ----------------------------------------------------------------------------

# Retention is cluster-wide (BACKWAVE["RETENTION"]), not a per-group option.
_GROUP_OPTION_FIELDS = {f.name: f for f in fields(WorkerGroupOptions) if f.name != "retention"} | {"queues": None}
_INT_GROUP_OPTIONS = {"pool_size", "pumps", "max_claim_batch", "max_outcome_batch", "claim_ahead"}
_FLOAT_GROUP_OPTIONS = {
    "poll_interval",
    "lease_duration",
    "heartbeat_interval",
    "maintenance_interval",
    "drain_timeout",
    "cancel_grace",
    "outcome_linger",
}

# The name of the group a worker runs when BACKWAVE["WORKER_GROUPS"] is empty and no --queues
# are given (implicit_groups).
IMPLICIT_GROUP_NAME = "default"


def group_from_mapping(raw: Mapping[str, Any]) -> WorkerGroupOptions:
    """Build one group from a settings dict, rejecting what is misspelt or out of range."""
    if not isinstance(raw, Mapping):
        raise WorkerGroupConfigError(f"A worker group must be a dict of options, got {type(raw).__name__}: {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise WorkerGroupConfigError(f"A worker group needs a 'name' (a non-empty string), got {name!r}")
    for key in raw:
        if key not in _GROUP_OPTION_FIELDS:
            hint = difflib.get_close_matches(key, _GROUP_OPTION_FIELDS, n=1)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise WorkerGroupConfigError(
                f"Worker Group '{name}' has an unknown option {key!r}.{suggestion} Known options: {', '.join(sorted(_GROUP_OPTION_FIELDS))}."
            )
    options: dict[str, Any] = {"name": name}
    if "policy" in raw and "queues" in raw:
        raise WorkerGroupConfigError(f"Worker Group '{name}' sets both 'policy' and 'queues'; give one.")
    if "policy" in raw:
        options["policy"] = raw["policy"]
    else:
        queues = raw.get("queues", ["default"])
        if isinstance(queues, str) or not isinstance(queues, Iterable):
            raise WorkerGroupConfigError(f"Worker Group '{name}': 'queues' must be a list of queue names, got {queues!r}")
        options["policy"] = Strict(*queues)
    for queue_name in options["policy"].queues:
        if not is_queue_name(queue_name):
            raise WorkerGroupConfigError(f"Worker Group '{name}': queue name {queue_name!r} is invalid; use {QUEUE_NAME_RULE}.")
    for key in _INT_GROUP_OPTIONS & raw.keys():
        value = raw[key]
        if key in ("max_outcome_batch", "claim_ahead") and value is None:
            options[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkerGroupConfigError(f"Worker Group '{name}': {key} must be a whole number, got {value!r}")
        if key == "claim_ahead":
            options[key] = value  # 0 (claim for free threads only) and the upper bound: validate_groups
            continue
        if key != "pumps" and value < 1:
            raise WorkerGroupConfigError(f"Worker Group '{name}': {key} must be at least 1, got {value}")
        options[key] = value
    for key in _FLOAT_GROUP_OPTIONS & raw.keys():
        value = raw[key]
        if key == "heartbeat_interval" and value is None:
            options[key] = None
            continue
        if key == "outcome_linger" and isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            options[key] = 0.0  # write each outcome at once; the range is checked with the intervals
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise WorkerGroupConfigError(f"Worker Group '{name}': {key} must be a positive number of seconds, got {value!r}")
        options[key] = float(value)
    if "database" in raw:
        database = raw["database"]
        if database is not None and (not isinstance(database, str) or not database):
            raise WorkerGroupConfigError(
                f"Worker Group '{name}': database must be a DATABASES alias (a string) or None, got {database!r}"
            )
        options["database"] = database
    if admitted := sorted(set(options["policy"].queues) & _admitted_queues_as_configured()):
        # A job claimed ahead starts later than its claim, which is what a rate window counts:
        # the starts of one window could spill into the next and overrun the rate.
        if options.get("claim_ahead"):
            raise WorkerGroupConfigError(
                f"Worker Group '{name}': claim_ahead must be 0 for a group serving {', '.join(admitted)}, under an "
                "admission limit (BACKWAVE['QUEUES']): a job claimed ahead would start after the claim that counted it."
            )
        options["claim_ahead"] = 0
    return WorkerGroupOptions(**options)


def _admitted_queues_as_configured() -> frozenset[str]:
    """The queues BACKWAVE["QUEUES"] puts under an admission limit. A malformed BACKWAVE or QUEUES
    is reported by its own check (and stops a worker before it claims): a group read beside it
    is checked for what it says itself, as if no queue were admitted."""
    user = getattr(settings, "BACKWAVE", {})
    queues = user.get("QUEUES", {}) if isinstance(user, Mapping) else {}
    if value_problem("QUEUES", queues, "BACKWAVE"):
        return frozenset()
    return admitted_queue_names(queues)


def declared_queue_names() -> list[str]:
    """The queues BackWave's backends in TASKS declare (their QUEUES, or Django's default
    ["default"] when they give none), in TASKS order, each once. Lenient like
    configured_queue_names: a malformed entry is its backend check's to report."""
    names: dict[str, None] = {}
    for options in getattr(settings, "TASKS", {}).values():
        if not isinstance(options, Mapping) or not str(options.get("BACKEND", "")).startswith("backwave."):
            continue
        queues = options.get("QUEUES", ["default"])
        if isinstance(queues, (list, tuple, set, frozenset)):
            names.update(dict.fromkeys(q for q in queues if isinstance(q, str) and is_queue_name(q)))
    return list(names)


def implicit_groups(task_queues: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The group a worker runs when BACKWAVE["WORKER_GROUPS"] is empty and no --queues are given:
    every queue the BackWave backends declare, then those of ``task_queues`` (the registered
    tasks', for a backend whose empty QUEUES accepts any queue), so a plain worker runs every
    job the project can enqueue. Several queues share the pumps by equal weights (Weighted): a
    busy queue never starves another, which a Strict order would let the first one do."""
    queues = list(dict.fromkeys([*declared_queue_names(), *sorted(set(task_queues))])) or ["default"]
    if len(queues) == 1:
        return [{"name": IMPLICIT_GROUP_NAME, "queues": queues}]
    return [{"name": IMPLICIT_GROUP_NAME, "policy": Weighted(dict.fromkeys(queues, 1))}]


def raw_worker_groups(task_queues: Iterable[str] = ()) -> list[Mapping[str, Any]]:
    """BACKWAVE["WORKER_GROUPS"] as written, or the implicit group when it is empty (implicit_groups)."""
    return list(get_setting("WORKER_GROUPS")) or implicit_groups(task_queues)


def worker_groups(raw_groups: Iterable[Mapping[str, Any]] | None = None) -> list[WorkerGroupOptions]:
    """``raw_groups`` (None: those of the settings, see raw_worker_groups) as validated groups.
    WorkerGroupConfigError (a ValueError), or ImproperlyConfigured for a malformed BACKWAVE when
    the settings are read, says what is wrong."""
    return validate_groups(group_from_mapping(raw) for raw in (raw_worker_groups() if raw_groups is None else raw_groups))


def configured_queue_names() -> set[str]:
    """Queue names the settings mention: BackWave backends' QUEUES, BACKWAVE["QUEUES"] and the
    worker groups'.

    Lenient on purpose (it feeds the admin's lists, which must render whatever the settings
    hold): entries of the wrong shape are skipped, and the system checks report them."""
    return set(declared_queues())


def declared_queues() -> dict[str, list[str]]:
    """Each queue the settings mention -> where (``TASKS['default']``, ``BACKWAVE['QUEUES']``,
    ``WORKER_GROUPS 'name'``), as leniently as ``configured_queue_names``."""
    places: dict[str, list[str]] = {}

    def add(names, place):
        for name in names:
            if isinstance(name, str) and place not in places.setdefault(name, []):
                places[name].append(place)

    for alias, options in getattr(settings, "TASKS", {}).items():
        if isinstance(options, dict) and str(options.get("BACKEND", "")).startswith("backwave."):
            add(options.get("QUEUES", ()), f"TASKS[{alias!r}]")
    backwave = getattr(settings, "BACKWAVE", {})
    if isinstance(backwave.get("QUEUES"), dict):
        add(backwave["QUEUES"], "BACKWAVE['QUEUES']")
    for group in backwave.get("WORKER_GROUPS", ()):
        if isinstance(group, dict):
            add(group.get("queues", ()), f"WORKER_GROUPS {group.get('name')!r}")
    return places


# --- schedules: the task side -----------------------------------------------------------------


class ScheduleConfigError(ValueError):
    """A declared schedule cannot be run by this worker (unknown task, bad arguments...)."""


def definitions_from_settings(schedules: Mapping[str, Mapping], registry: TaskRegistry) -> list[ScheduleDefinition]:
    """The rows to write for ``BACKWAVE["SCHEDULES"]`` (already shape-checked by ``value_problem``).

    Each schedule's job fields are what enqueueing its task would write (queue, priority, retry
    options, backend, tags, with the schedule's overrides), validated the same way, so a minted
    job is indistinguishable from an enqueued one.
    """
    from .store.contract import ScheduleDefinition

    definitions = []
    for name, spec in schedules.items():
        where = f"BACKWAVE['SCHEDULES'][{name!r}]"
        task = registry.get(spec["task"])
        if task is None:
            close = difflib.get_close_matches(spec["task"], list(registry), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ScheduleConfigError(
                f"{where} names the task {spec['task']!r}, which is not registered in this worker.{hint} "
                "A task is registered when it is defined in an installed app's tasks.py or in a module of BACKWAVE['TASK_MODULES']."
            )
        overrides = {"queue_name": spec.get("queue"), "priority": spec.get("priority"), "max_attempts": spec.get("max_attempts")}
        overrides = {key: value for key, value in overrides.items() if value is not None}
        try:
            task = task.using(**overrides)
            backend = task.get_backend()
            build_job = getattr(backend, "build_job", None)
            if build_job is None:
                raise ScheduleConfigError(f"{where}: the task's backend {task.backend!r} is not a BackWave backend.")
            job = build_job(task, spec.get("args", []), spec.get("kwargs", {}))
        except ScheduleConfigError:
            raise
        except Exception as error:  # InvalidTask, TypeError from .using(): the message says what is wrong
            raise ScheduleConfigError(f"{where}: {error}") from error
        if job.unique_key is not None:
            # A schedule's uniqueness is its slot (one job per slot, by constraint); a task's
            # Unique would be silently ignored on minted jobs, so it is refused here instead.
            raise ScheduleConfigError(
                f"{where}: the task {job.task_path!r} declares uniqueness (unique=...), which minted jobs do not apply: a "
                "schedule makes one job per slot already. Schedule a task without unique=, or enqueue it yourself."
            )
        definitions.append(
            ScheduleDefinition(
                name=name,
                task_path=job.task_path,
                cron=spec["cron"],
                args=job.payload["args"],
                kwargs=job.payload["kwargs"],
                queue=job.queue,
                priority=job.priority,
                max_attempts=job.max_attempts,
                backoff_base=job.backoff_base,
                backoff_max=job.backoff_max,
                backend=job.backend,
                tags=tuple(job.tags),
                timeout=job.timeout,
                limit_key=job.limit_key,
                enabled=spec.get("enabled", True),
            )
        )
    return definitions


def delivery_options():
    """BACKWAVE["OBSERVER_*"] as the observer loop takes them (ImproperlyConfigured, naming the
    setting, for a value it cannot use)."""
    from .core.deliveries import DeliveryOptions

    base, cap = get_setting("OBSERVER_BACKOFF_BASE"), get_setting("OBSERVER_BACKOFF_MAX")
    if problem := backoff_problem(
        base, cap, base_label=f"OBSERVER_BACKOFF_BASE ({base})", cap_label=f"OBSERVER_BACKOFF_MAX ({cap})"
    ):
        raise ImproperlyConfigured(problem)
    return DeliveryOptions(
        max_deliveries=get_setting("OBSERVER_MAX_DELIVERIES"),
        backoff_base=float(base),
        backoff_max=float(cap),
        lease=float(get_setting("OBSERVER_LEASE")),
        batch=get_setting("OBSERVER_BATCH"),
        poll_interval=float(get_setting("OBSERVER_POLL_INTERVAL")),
    )

"""What a queue name and a queue's concurrency limit may be: one rule each, in one place.

Every way a queue name comes in uses these: a task's definition and its enqueue
(``tasking.task``, ``tasking.backend``), the settings (``conf``: QUEUES, SCHEDULES; the backend's check of
TASKS QUEUES), the worker's groups (``conf``), the admin's queue actions and
``manage.py backwave_queue`` (``admin.actions``), and the Queue table's own check constraint
(``models``). The module imports nothing but ``re``, so each of them (the settings layer
included, which Django loads early) can import it without a cycle.
"""

from __future__ import annotations

import re

MAX_QUEUE_NAME_LENGTH = 64  # Job.queue and Queue.name are varchar(64)

# \Z, never $: Python's $ also matches before a trailing newline, so "emails\n" would pass.
QUEUE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
# The same rule for PostgreSQL's check constraint, where $ is the end of the string (no newline
# exception). Its text is part of migration 0003: changing it needs a new migration.
QUEUE_NAME_DATABASE_REGEX = r"^[A-Za-z0-9_.-]{1,64}$"
QUEUE_NAME_RULE = f"1 to {MAX_QUEUE_NAME_LENGTH} letters, digits, '_', '.' or '-'"

MAX_CONCURRENCY_LIMIT = 2**31 - 1  # Queue.concurrency_limit is a PostgreSQL integer
CONCURRENCY_LIMIT_RULE = f"a whole number from 1 to {MAX_CONCURRENCY_LIMIT:,}"


def is_queue_name(value) -> bool:
    """True when ``value`` is a string BackWave accepts as a queue name."""
    return isinstance(value, str) and QUEUE_NAME_PATTERN.match(value) is not None


def is_concurrency_limit(value) -> bool:
    """True when ``value`` is a concurrency limit the Queue table can hold (None, unlimited, is
    the caller's to allow)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY_LIMIT


def validate_queue_name(name) -> str:
    """The name, or ValueError saying what a queue name may be."""
    if not is_queue_name(name):
        raise ValueError(f"Invalid queue name {name!r}: use {QUEUE_NAME_RULE}.")
    return name


def validate_concurrency_limit(limit) -> int | None:
    """The limit (None: unlimited), or ValueError saying what is allowed."""
    if limit is None:
        return None
    if not is_concurrency_limit(limit):
        raise ValueError(f"Invalid concurrency limit {limit!r}: use {CONCURRENCY_LIMIT_RULE}, or none for unlimited.")
    return limit


def parse_concurrency_limit(text: str, *, unlimited: str) -> int | None:
    """A limit as an operator typed it: blank, "none" or "unlimited" is None, else ASCII digits
    within the column's range. ``unlimited`` says, in the error, how to ask for no limit."""
    text = text.strip()
    if text.lower() in ("", "none", "unlimited"):
        return None
    # ASCII only: int() also reads "٣" and " 1_000 ", and refuses "²" with a message about base 10.
    limit = int(text) if text.isascii() and text.isdigit() else None
    if limit is None or not is_concurrency_limit(limit):
        raise ValueError(f"Invalid concurrency limit {text!r}: use {CONCURRENCY_LIMIT_RULE}, or {unlimited} for unlimited.")
    return limit

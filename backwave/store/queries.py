"""The named SQL blocks of ``queries.sql``, loaded once at import."""

from __future__ import annotations

import re
from pathlib import Path

QUERIES_FILE = Path(__file__).with_name("queries.sql")

_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$")
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


def parse_queries(text: str) -> dict[str, str]:
    """Split ``text`` into ``{name: sql}`` at each ``-- name: <name>`` line.

    Whole-line comments are dropped (they are for the reader, and psycopg would read a ``%`` in
    them as a placeholder); anything before the first name line is the file's preamble. A
    ``{{name}}`` in a block is replaced by that block's text: CTEs several statements share
    (settle_dependents), written once.
    """
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if match := _NAME_LINE.match(line.strip()):
            name = match.group(1)
            if name in queries:
                raise ValueError(f"{QUERIES_FILE.name}: query {name!r} is defined twice")
            current = queries[name] = []
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line.rstrip())
    result = {name: "\n".join(lines).strip() for name, lines in queries.items()}
    if empty := [name for name, sql in result.items() if not sql]:
        raise ValueError(f"{QUERIES_FILE.name}: query {empty[0]!r} has no SQL")

    def include(match: re.Match) -> str:
        if match.group(1) not in result or _INCLUDE.search(result[match.group(1)]):
            raise ValueError(f"{QUERIES_FILE.name}: {{{{{match.group(1)}}}}} names no block, or one that includes another")
        return result[match.group(1)]

    return {name: _INCLUDE.sub(include, sql) for name, sql in result.items()}


QUERIES: dict[str, str] = parse_queries(QUERIES_FILE.read_text(encoding="utf-8"))


NAMED_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%")


def native_statement(sql: str) -> tuple[bytes, tuple[str, ...]] | None:
    """``sql`` with PostgreSQL's own ``$n`` placeholders in place of ``%(name)s``, and the names
    in ``$n`` order; None for a statement with any other ``%`` (positional ones).

    psycopg parses a query's placeholders on every execution, and caches the parse only for a
    query of at most 4,096 bytes: the outcome write (about 7,500 with the settling of dependents)
    was parsed afresh on every batch, a regular expression over the whole text. Sent through a
    RawCursor, a statement is passed through as it is. Converted once per text (the texts are the
    fixed ones of queries.sql, so the cache stays small).
    """
    names: dict[str, int] = {}
    unsupported = False

    def native(match: re.Match) -> str:
        nonlocal unsupported
        if match.group(1) is not None:
            return f"${names.setdefault(match.group(1), len(names) + 1)}"
        if match.group(0) == "%%":
            return "%"
        unsupported = True
        return match.group(0)

    text = NAMED_PLACEHOLDER.sub(native, sql)
    return None if unsupported else (text.encode(), tuple(names))

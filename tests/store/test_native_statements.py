"""The store sends its statements with PostgreSQL's own placeholders, parsed once per text.

psycopg parses ``%(name)s`` placeholders on every execution and caches that parse only for
queries of at most 4,096 bytes. The outcome write with the settling of dependents is about
7,500: in the throughput benchmark psycopg's parse and parameter adaptation became the largest
part of the worker's client CPU per batch. These tests count parses, never time them.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import _queries

from backwave.core.outcomes import OutcomeKind
from backwave.store.contract import OutcomeRecord
from backwave.store.queries import QUERIES, native_statement


def test_named_placeholders_become_numbered_ones_in_order_of_first_use():
    text, names = native_statement("SELECT %(b)s, %(a)s::int, %(b)s, '100%%'")
    assert text == b"SELECT $1, $2::int, $1, '100%'"
    assert names == ("b", "a")


def test_a_statement_with_positional_placeholders_is_left_to_psycopg():
    assert native_statement("SELECT %s, %(a)s") is None


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_statement_converts_to_the_same_placeholders_psycopg_would_send(name):
    native = native_statement(QUERIES[name])
    if native is None:
        assert re.search(r"%s", QUERIES[name]), f"{name} has no positional placeholder but was not converted"
        return
    text, names = native
    query = _queries.PostgresQuery(psycopg.adapt.Transformer())
    query.convert(QUERIES[name], dict.fromkeys(names))
    assert query.query == text, name


@pytest.mark.stores("postgres")
def test_the_hot_path_parses_no_query_text(store, lease, rows, monkeypatch):
    """After the first use of each text: a write-then-claim, a claim and a heartbeat make psycopg
    parse no placeholder at all."""
    rows.make_jobs(40)
    parses = []
    original = _queries.PostgresQuery.convert
    monkeypatch.setattr(_queries.PostgresQuery, "convert", lambda self, *args: (parses.append(args[0]), original(self, *args))[1])

    jobs = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=20)
    for _ in range(2):
        applied, jobs = store.write_outcomes_then_claim(
            lease_id=lease.id,
            worker_id=lease.worker_id,
            outcomes=[OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED) for job in jobs],
            queues=["default"],
            limit=10,
        )
        assert len(applied) > 0
    store.heartbeat(lease_id=lease.id, duration=60.0)
    assert parses == []

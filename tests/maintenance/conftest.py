"""Fixtures for maintenance against a real PostgreSQL: schedules, retention, pump health.

The store opens its own connections, so the tests commit their rows (transactional_db)."""

from __future__ import annotations

import pytest
from django.db import connection

from backwave.store.postgres import PostgresStore


@pytest.fixture
def make_store(transactional_db):
    """Build PostgresStores on the test database; closed after the test."""
    stores: list[PostgresStore] = []

    def make() -> PostgresStore:
        store = PostgresStore.from_django()
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store) -> PostgresStore:
    return make_store()


def sql(statement: str, params=()) -> list[tuple]:
    """Run one statement on Django's connection; its rows (or [])."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []

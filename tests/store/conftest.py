"""Fixtures for the PostgreSQL store tests.

The store opens connections of its own, so every test module here marks its tests
``django_db(transaction=True)``: rows are committed, and the store's connections see them.
"""

from __future__ import annotations

import uuid

import pytest

from backwave.store.postgres import PostgresStore

from .helpers import LeaseRef


@pytest.fixture
def make_store(transactional_db):
    """Build stores (each with its own connection) on the test database; closed after the test."""
    stores: list[PostgresStore] = []

    def make(**kwargs) -> PostgresStore:
        store = PostgresStore.from_django(**kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store) -> PostgresStore:
    return make_store()


@pytest.fixture
def open_lease(store):
    """Open a live lease (by the database clock) on ``store`` or another one; returns its ref."""

    def open_(worker_id: str = "host:1:default:0", *, on: PostgresStore | None = None, duration: float = 60.0) -> LeaseRef:
        lease = LeaseRef(id=uuid.uuid4(), worker_id=worker_id)
        (on or store).open_lease(lease_id=lease.id, worker_id=worker_id, group="default", hostname="host", pid=1, duration=duration)
        return lease

    return open_


@pytest.fixture
def lease(open_lease) -> LeaseRef:
    return open_lease()

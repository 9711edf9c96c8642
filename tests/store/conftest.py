"""Fixtures for the store contract tests: every test runs against every store implementation.

``store_kind`` parametrizes each test that uses a store: ``postgres`` (PostgresStore, its own
connection), ``memory`` (InMemoryStore on a virtual clock) and ``django`` (the test pump's
DjangoConnectionStore, on Django's connection). A test that checks something only one of them
has (a query plan, a killed backend, row locks held by another session) says which with
``@pytest.mark.stores("postgres")``.

The PostgreSQL-backed kinds commit their rows, so they run under ``transactional_db`` and
``rows`` reads them through the ORM; the memory kind reads its own tables.
"""

from __future__ import annotations

import uuid

import pytest

from backwave.testing.memory_store import InMemoryStore, MemoryDatabase
from backwave.store.postgres import PostgresStore
from backwave.testing.store import DjangoConnectionStore

from .helpers import LeaseRef, MemoryRows, PostgresRows, TickingClock

STORE_KINDS = ("postgres", "memory", "django")


def pytest_configure(config):
    config.addinivalue_line("markers", "stores(*kinds): run a store test only against these store kinds")


def pytest_generate_tests(metafunc):
    if "store_kind" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("stores")
        kinds = marker.args if marker else STORE_KINDS
        unknown = set(kinds) - set(STORE_KINDS)
        assert not unknown, f"unknown store kinds {unknown}; known: {STORE_KINDS}"
        # The PostgreSQL-backed kinds commit their rows, so their tests run under transactional_db.
        marks = {"postgres": pytest.mark.django_db(transaction=True), "django": pytest.mark.django_db, "memory": ()}
        metafunc.parametrize("store_kind", [pytest.param(kind, marks=marks[kind]) for kind in kinds])


@pytest.fixture
def memory_database() -> MemoryDatabase:
    return MemoryDatabase(now=TickingClock())


@pytest.fixture
def rows(request, store_kind):
    """The tables of the store under test: set rows up, read them back, move the clock."""
    if store_kind == "memory":
        return MemoryRows(request.getfixturevalue("memory_database"))
    return PostgresRows()


@pytest.fixture
def make_store(request, store_kind, rows):
    """Build stores on the database under test (each one a connection of its own); closed after the test."""
    stores: list = []

    def make(**kwargs):
        if store_kind == "postgres":
            store = PostgresStore.from_django(**kwargs)
        elif store_kind == "django":
            store = DjangoConnectionStore(**kwargs)
        else:
            store = InMemoryStore(request.getfixturevalue("memory_database"), **kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store):
    return make_store()


@pytest.fixture
def open_lease(store):
    """Open a live lease (by the database clock) on ``store`` or another one; returns its ref."""

    def open_(worker_id: str = "host:1:default:0", *, on=None, duration: float = 60.0) -> LeaseRef:
        lease = LeaseRef(id=uuid.uuid4(), worker_id=worker_id)
        (on or store).open_lease(
            lease_id=lease.id, worker_id=worker_id, group="default", hostname="host", pid=1, duration=duration
        )
        return lease

    return open_


@pytest.fixture
def lease(open_lease) -> LeaseRef:
    return open_lease()

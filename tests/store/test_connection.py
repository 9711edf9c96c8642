"""The store's connection: settings, error translation, reconnecting after a failure."""

from __future__ import annotations

import uuid

import psycopg
import psycopg.errors
import pytest
from django.db import connection

from backwave.core.jobs import OutcomeKind
from backwave.store.contract import OutcomeRecord, StoreError, TransientStoreError
from backwave.store.postgres import PostgresStore, django_conninfo, is_transient

# All PostgreSQL-only: connection settings, a killed backend, SQLSTATE classification.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stores("postgres")]


def terminate(pid: int) -> None:
    """End the backend ``pid`` from Django's connection, waiting until it is gone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
        assert cursor.fetchone()[0] is True


def claim(store, lease, limit=10):
    return store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["default"], limit=limit)


def test_django_settings_become_connection_keywords():
    params = django_conninfo({
        "ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "u", "PASSWORD": "p",
        "HOST": "/run/postgresql", "PORT": 5433,
        "OPTIONS": {"sslmode": "prefer", "pool": True, "server_side_binding": True, "isolation_level": 1, "assume_role": "r"},
    })
    assert params == {"dbname": "app", "user": "u", "password": "p", "host": "/run/postgresql", "port": "5433", "sslmode": "prefer"}


def test_a_database_that_is_not_postgresql_is_refused():
    with pytest.raises(StoreError, match="needs a PostgreSQL database"):
        django_conninfo({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"})


def test_the_connection_names_itself_and_is_reused(store):
    pid = store.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [pid])
        assert cursor.fetchone() == ("backwave",)
    store.expire_leases(limit=1)
    assert store.backend_pid == pid


def test_a_conninfo_string_works_too(transactional_db):
    params = django_conninfo(connection.settings_dict)
    conninfo = psycopg.conninfo.make_conninfo(**params)
    with PostgresStore(conninfo, application_name="backwave-test") as store:
        assert store.expire_leases(limit=1) == 0
        with connection.cursor() as cursor:
            cursor.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [store.backend_pid])
            assert cursor.fetchone() == ("backwave-test",)


def test_a_lost_connection_is_transient_and_the_next_call_reconnects(store, lease, rows):
    rows.make_jobs(3)
    old_pid = store.backend_pid
    terminate(old_pid)

    with pytest.raises(TransientStoreError):
        claim(store, lease)
    assert len(claim(store, lease)) == 3
    assert store.backend_pid != old_pid


def test_a_connection_lost_before_a_pipelined_write_is_transient_too(store, lease, rows):
    rows.make_jobs(2)
    (job,) = claim(store, lease, limit=1)
    terminate(store.backend_pid)
    outcomes = [OutcomeRecord(job_id=job.id, attempt=1, kind=OutcomeKind.SUCCEEDED)]

    with pytest.raises(TransientStoreError):
        store.write_outcomes_then_claim(lease_id=lease.id, worker_id=lease.worker_id, outcomes=outcomes, queues=["default"], limit=5)
    applied, claimed = store.write_outcomes_then_claim(lease_id=lease.id, worker_id=lease.worker_id, outcomes=outcomes, queues=["default"], limit=5)
    assert applied == {job.id}
    assert len(claimed) == 1


def test_a_connection_that_cannot_be_opened_is_transient(tmp_path):
    with pytest.raises(TransientStoreError, match="cannot connect"):
        PostgresStore({"host": str(tmp_path), "port": 1, "dbname": "nowhere", "connect_timeout": 2})


def test_a_constraint_violation_is_not_transient(store):
    lease_id = uuid.uuid4()
    store.open_lease(lease_id=lease_id, worker_id="w", group="g", hostname="h", pid=1, duration=60)
    with pytest.raises(StoreError, match="23505") as caught:
        store.open_lease(lease_id=lease_id, worker_id="w", group="g", hostname="h", pid=1, duration=60)
    assert not isinstance(caught.value, TransientStoreError)
    assert isinstance(caught.value.__cause__, psycopg.errors.UniqueViolation)
    assert store.renew_lease(lease_id=lease_id, duration=60) is True  # the connection is fine


def test_a_closed_store_refuses_work(store):
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.expire_leases(limit=1)
    store.close()  # closing twice is harmless


@pytest.mark.parametrize("sqlstate", ["40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "08006", "53300"])
def test_transient_sqlstates(sqlstate):
    assert is_transient(psycopg.errors.lookup(sqlstate)("boom"))


@pytest.mark.parametrize("sqlstate", ["23505", "42P01", "22012", "54000", "25P02"])
def test_other_sqlstates_are_not_transient(sqlstate):
    assert not is_transient(psycopg.errors.lookup(sqlstate)("boom"))


def test_client_side_connection_errors_and_broken_connections_are_transient():
    assert is_transient(psycopg.OperationalError("connection refused"))
    assert is_transient(psycopg.errors.lookup("42P01")("boom"), connection_broken=True)
    assert not is_transient(psycopg.InterfaceError("misuse"))

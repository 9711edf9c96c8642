"""The store's connection: settings, error translation, reconnecting after a failure."""

from __future__ import annotations

import os
import socket
import uuid

import psycopg
import psycopg.errors
import pytest
from django.db import connection

from backwave.core.jobs import OutcomeKind
from backwave.shell.hints import HintListener
from backwave.store.contract import OutcomeRecord, StoreError, TransientStoreError
from backwave.store.postgres import PostgresStore, django_conninfo, is_transient

from .helpers import in_effect, server_default

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
    params = django_conninfo(
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "app",
            "USER": "u",
            "PASSWORD": "p",
            "HOST": "/run/postgresql",
            "PORT": 5433,
            "OPTIONS": {"sslmode": "prefer", "pool": True, "server_side_binding": True, "isolation_level": 1, "assume_role": "r"},
        }
    )
    assert params == {
        "dbname": "app",
        "user": "u",
        "password": "p",
        "host": "/run/postgresql",
        "port": "5433",
        "sslmode": "prefer",
    }


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
        store.write_outcomes_then_claim(
            lease_id=lease.id, worker_id=lease.worker_id, outcomes=outcomes, queues=["default"], limit=5
        )
    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=outcomes, queues=["default"], limit=5
    )
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


def test_a_statement_the_server_refuses_behind_the_transaction_settings_keeps_the_connection(store):
    # The settings go down the same pipeline, first; a refused operation is still the last
    # statement of it, so no later Parse was skipped and the connection stays clean.
    pid = store.backend_pid
    lease_id = uuid.uuid4()
    store.open_lease(lease_id=lease_id, worker_id="w", group="g", hostname="h", pid=1, duration=60)
    with pytest.raises(StoreError, match="23505") as caught:
        store.open_lease(lease_id=lease_id, worker_id="w", group="g", hostname="h", pid=1, duration=60)
    assert caught.value.statement == "open_lease"
    assert store.backend_pid == pid
    assert store.renew_lease(lease_id=lease_id, duration=60) is True


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


# ---- connect-time faults: classified by their cause -----------------------------------------------


def params(**overrides) -> dict:
    """This test database's connection keywords, with some changed (a misconfiguration)."""
    return {**django_conninfo(connection.settings_dict), "connect_timeout": 5, **overrides}


@pytest.mark.parametrize(
    ("overrides", "server_says"),
    [
        ({"dbname": "backwave_no_such_db"}, 'database "backwave_no_such_db" does not exist'),
        ({"user": "backwave_no_such_role"}, 'role "backwave_no_such_role" does not exist'),
        ({"options": "-c backwave_no_such_parameter=1"}, "unrecognized configuration parameter"),
        ({"options": "-c backwave.bad.name=1 -c statement_timeout=soon"}, 'invalid value for parameter "statement_timeout"'),
        ({"options": "-c shared_buffers=1GB"}, 'parameter "shared_buffers" cannot be changed without restarting the server'),
    ],
    ids=["missing-database", "unknown-role", "unknown-startup-parameter", "invalid-startup-value", "restart-only-parameter"],
)
def test_a_connection_the_server_refuses_for_good_is_a_permanent_fault(overrides, server_says):
    with pytest.raises(StoreError, match=server_says) as caught:
        PostgresStore(params(**overrides))
    assert not isinstance(caught.value, TransientStoreError), "retrying this for ever would look healthy and do nothing"
    assert "cannot connect to PostgreSQL" in str(caught.value)


def test_a_role_out_of_connection_slots_is_transient():
    """'too many connections for role' (53300) passes once other sessions end: retried."""
    role = f"backwave_full_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
    try:
        with pytest.raises(TransientStoreError, match="too many connections for role"):
            PostgresStore(params(user=role))
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP ROLE "{role}"')


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: Connection refused\n\tIs the server running?',
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: timeout expired',
        "consuming input failed: server closed the connection unexpectedly",
        "connection failed: Connection reset by peer",
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  the database system is starting up',
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  the database system is shutting down',
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  the database system is in recovery mode',
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  sorry, too many clients already',
        "connection failed: FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
    ],
)
def test_connect_faults_that_pass_are_transient(message):
    assert is_transient(psycopg.OperationalError(message))


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  password authentication failed for user "app"',
        'connection failed: connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed: FATAL:  Peer authentication failed for user "app"',
        'connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", database "app", no encryption',
        "connection failed: fe_sendauth: no password supplied",
        'connection failed: FATAL:  role "app" is not permitted to log in',
        'connection failed: FATAL:  permission denied for database "app"\nDETAIL:  User does not have CONNECT privilege.',
        'connection failed: FATAL:  database "app" does not exist',
    ],
)
def test_bad_credentials_and_settings_are_permanent(message):
    assert not is_transient(psycopg.OperationalError(message))


# ---- bounded waits: lock and statement timeouts, TCP keepalives ---------------------------------


@pytest.fixture
def lock_holder(transactional_db):
    """Take a row lock on a connection of its own and hold it. The holder's session ends itself
    after a few seconds idle in its transaction, so a store that does not give up on the lock
    still gets it back in the end (and the test then fails instead of hanging)."""
    holders = []

    def hold(sql: str, params) -> None:
        holder = psycopg.connect(**django_conninfo(connection.settings_dict))
        holder.execute("SET idle_in_transaction_session_timeout = '4s'")
        holder.execute(sql, params)  # opens the transaction that keeps the lock
        holders.append(holder)

    yield hold
    for holder in holders:
        holder.close()


def lease_row_locked_by(lock_holder, lease):
    lock_holder("SELECT 1 FROM backwave_lease WHERE id = %s FOR UPDATE", [lease.id])


def test_a_row_lock_held_elsewhere_becomes_a_transient_lock_timeout(store, lease, lock_holder):
    lease_row_locked_by(lock_holder, lease)

    with pytest.raises(TransientStoreError, match=r"renew_lease failed \[55P03\]") as caught:
        store.renew_lease(lease_id=lease.id, duration=60)
    assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)


def test_a_statement_that_runs_too_long_becomes_a_transient_statement_timeout(make_store, lease, lock_holder):
    # No lock timeout: the wait for the row lock is simply a statement that does not finish.
    store = make_store(statement_timeout=0.2, lock_timeout=None)
    lease_row_locked_by(lock_holder, lease)

    with pytest.raises(TransientStoreError, match=r"renew_lease failed \[57014\]") as caught:
        store.renew_lease(lease_id=lease.id, duration=60)
    assert isinstance(caught.value.__cause__, psycopg.errors.QueryCanceled)


def test_by_default_statements_run_under_timeouts_from_the_lease_and_the_database_s_commit_setting(
    settings, store_kind, make_store
):
    worker_settings = ("WORKER_SYNCHRONOUS_COMMIT", "WORKER_STATEMENT_TIMEOUT", "WORKER_LOCK_TIMEOUT")
    settings.BACKWAVE = {key: value for key, value in settings.BACKWAVE.items() if key not in worker_settings}
    applied = in_effect(make_store())
    # Derived from the default lease (30 s): a fifth for a statement, a third of that for a lock.
    assert applied["statement_timeout"][0] == "6000"
    assert applied["lock_timeout"][0] == "2000"
    assert applied["synchronous_commit"] == (server_default("synchronous_commit"),) * 2


def test_synchronous_commit_off_is_set_per_transaction_and_never_at_connect(settings, store_kind, make_store):
    settings.BACKWAVE = {**settings.BACKWAVE, "WORKER_SYNCHRONOUS_COMMIT": False}
    store = make_store()
    before = store.round_trips

    inside, session = in_effect(store)["synchronous_commit"]
    assert inside == "off"
    # The session's own value (what a startup option or a SET after connect would change) is the
    # server's: nothing is sent at connect that a transaction-pooling PgBouncer would refuse.
    assert session == server_default("synchronous_commit") == "on"
    assert store.round_trips == before + 1
    # Timeouts travel the same way: inside the transaction only.
    for name in ("statement_timeout", "lock_timeout"):
        inside, session = in_effect(store)[name]
        assert inside != "0"
        assert session == server_default(name)


def test_settings_of_the_session_from_database_options_stay_and_backwave_s_win_inside_its_transactions(transactional_db):
    params = {**django_conninfo(connection.settings_dict), "options": "-c statement_timeout=60000 -c lock_timeout=50000"}
    with PostgresStore(params, statement_timeout=1.5, lock_timeout=0.5) as store:
        settings = in_effect(store)
    assert settings["statement_timeout"] == ("1500", "60000")
    assert settings["lock_timeout"] == ("500", "50000")


def test_a_store_may_leave_every_setting_as_the_session_has_it(transactional_db):
    with PostgresStore(django_conninfo(connection.settings_dict), statement_timeout=None, lock_timeout=None) as store:
        before = store.round_trips
        settings = in_effect(store)
        assert store.round_trips == before + 1
    assert all(inside == session for inside, session in settings.values())


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "5"])
@pytest.mark.parametrize("keyword", ["statement_timeout", "lock_timeout"])
def test_a_timeout_must_be_a_positive_number_of_seconds(keyword, value):
    with pytest.raises(
        ValueError,
        match=rf"^{keyword} must be a finite number of seconds above 0, or None to leave the session's value; got {value!r}$",
    ):
        PostgresStore({"host": "/nonexistent", "dbname": "x"}, **{keyword: value})


def client_socket_options(backend_pid: int) -> dict[str, int]:
    """The TCP options libpq put on this process's socket to the server backend ``backend_pid``
    (found by the client port the server reports for it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT client_port FROM pg_stat_activity WHERE pid = %s", [backend_pid])
        (port,) = cursor.fetchone()
    if port is None or port < 0:
        pytest.skip("the database is reached over a Unix socket, where TCP keepalives do not apply")
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue  # not a socket
        with sock:
            if (
                sock.family not in (socket.AF_INET, socket.AF_INET6)
                or sock.type != socket.SOCK_STREAM
                or sock.getsockname()[1] != port
            ):
                continue
            return {
                "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            }
    raise AssertionError(f"no socket of this process has the local port {port}")


# A dead peer is noticed within seconds, not the kernel's two hours of silence before a first
# keepalive probe, nor its quarter of an hour of retransmissions.
BACKWAVE_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


def test_a_store_connection_carries_tcp_keepalives(store):
    assert client_socket_options(store.backend_pid) == BACKWAVE_KEEPALIVES


def test_keepalives_set_in_the_database_options_win(transactional_db):
    params = {**django_conninfo(connection.settings_dict), "keepalives_idle": 30, "tcp_user_timeout": 0}
    with PostgresStore(params) as store:
        assert client_socket_options(store.backend_pid) == {**BACKWAVE_KEEPALIVES, "keepalives_idle": 30, "tcp_user_timeout": 0}


def test_the_hint_listener_connection_carries_tcp_keepalives(transactional_db):
    listener = HintListener(django_conninfo(connection.settings_dict))
    listener.start()
    try:
        assert listener.connected.wait(10)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'backwave-hints' AND datname = current_database()"
            )
            (pid,) = cursor.fetchone()
        assert client_socket_options(pid) == BACKWAVE_KEEPALIVES
    finally:
        listener.stop()


def succeed_and_claim(store, lease, jobs, limit=4):
    outcomes = [
        OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED, return_value=job.id) for job in jobs
    ]
    applied, claimed = store.write_outcomes_then_claim(
        lease_id=lease.id, worker_id=lease.worker_id, outcomes=outcomes, queues=["default"], limit=limit
    )
    assert applied == {job.id for job in jobs}
    return claimed


def count_cursors_made(monkeypatch) -> list[int]:
    made = [0]
    init = psycopg.RawCursor.__init__

    def counting(self, *args, **kwargs):
        made[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.RawCursor, "__init__", counting)
    return made


def test_a_steady_pump_s_round_trips_run_on_the_cursors_of_the_first(store, lease, rows, monkeypatch):
    """A fresh cursor looks up how to send each parameter and read each column again; a pump
    spends one round-trip per batch, so its statements keep theirs."""
    rows.make_jobs(20)
    made = count_cursors_made(monkeypatch)
    jobs = succeed_and_claim(store, lease, claim(store, lease, limit=4))
    first = made[0]
    assert first > 0
    for _ in range(3):
        jobs = succeed_and_claim(store, lease, jobs)
    assert len(jobs) == 4
    assert made[0] == first
    assert rows.count("succeeded") == 16


def test_a_round_trip_after_a_reconnect_runs_on_cursors_of_the_new_connection(store, lease, rows, monkeypatch):
    rows.make_jobs(12)
    jobs = succeed_and_claim(store, lease, claim(store, lease, limit=4))
    terminate(store.backend_pid)
    with pytest.raises(TransientStoreError):
        succeed_and_claim(store, lease, jobs)
    made = count_cursors_made(monkeypatch)
    # The write that failed never landed: the same outcomes go again, on the new connection.
    jobs = succeed_and_claim(store, lease, jobs)
    assert made[0] > 0
    assert len(jobs) == 4
    assert rows.count("succeeded") == 8

"""Operator actions racing each other, a worker's claim and the retention purge, on real
connections: each action runs on its own thread (its own Django connection) while the test holds
a row lock on another, and waits on the server's own lock table, never on the clock."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from django.db import connection, connections, transaction

from backwave.ops import actions as operations
from backwave.models import Job, Queue, Schedule

from .conftest import make_job, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

# Planner settings that make one session visit rows in heap order and the other in id order,
# as a big selection (hash join over a sequential scan) and a small one (index scans) would.
HEAP_ORDER = ("SET enable_indexscan = off", "SET enable_bitmapscan = off", "SET enable_indexonlyscan = off")
ID_ORDER = ("SET enable_seqscan = off", "SET enable_hashjoin = off", "SET enable_mergejoin = off", "SET enable_bitmapscan = off")


class Operator(threading.Thread):
    """One operator's action on its own connection; keeps the result or the error."""

    def __init__(self, action, planner=()):
        super().__init__(daemon=True)
        self.action, self.planner = action, planner
        self.pid: int | None = None
        self.ready = threading.Event()
        self.result = self.error = None

    def run(self):
        try:
            with connection.cursor() as cursor:
                for statement in self.planner:
                    cursor.execute(statement)
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.ready.set()
            self.result = self.action()
        except Exception as error:  # counted by the test
            self.error = error
        finally:
            self.ready.set()
            connections.close_all()

    def start_and_wait_until_blocked(self):
        self.start()
        assert self.ready.wait(30), "the operator's thread never connected"
        assert self.pid is not None, f"the operator's thread failed to connect: {self.error!r}"
        wait_until_blocked(self.pid)
        return self

    def finish(self):
        self.join(60)
        assert not self.is_alive(), "the action never finished"
        return self


def wait_until_blocked(pid: int, attempts: int = 3000) -> None:
    """Return once backend ``pid`` waits for a row lock (read live from pg_locks on a side connection)."""
    params = {**connection.get_connection_params(), "autocommit": True}
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as side:
        for _ in range(attempts):
            if side.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid]).fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked on a lock")


def heap_order(table: str, column: str, values) -> list:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {column} = ANY(%s) ORDER BY ctid", [list(values)])
        return [row[0] for row in cursor.fetchall()]


def move_to_the_heap_end(table: str, column: str, values) -> None:
    """Rewrite these rows (an update writes a new row version after the others), so that heap
    order and key order disagree: the two orders two overlapping actions could lock rows in."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = {column} WHERE {column} = ANY(%s)", [list(values)])


def race(gate_sql: str, gate_params, *operators: Operator) -> list[Exception]:
    """Hold a lock on one row (``gate_sql``) until every operator, in turn, waits for a lock,
    then commit and let them finish. Two that lock overlapping rows in different orders
    deadlock here, and PostgreSQL aborts one of them."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(gate_sql, gate_params)
        for operator in operators:
            operator.start_and_wait_until_blocked()
    for operator in operators:
        operator.finish()
    return [operator.error for operator in operators if operator.error is not None]


@pytest.mark.parametrize(
    ("state", "action"), [("failed", operations.retry_job_ids), ("ready", operations.cancel_job_ids)], ids=["retry", "cancel"]
)
def test_overlapping_job_actions_never_deadlock(state, action):
    a, b, c, d = (make_job(state=state).pk for _ in range(4))
    move_to_the_heap_end("backwave_job", "id", [a, b])
    assert heap_order("backwave_job", "id", [a, b, c, d]) == [c, d, a, b]

    by_id = Operator(lambda: action([a, b, c, d]), planner=ID_ORDER)
    by_heap = Operator(lambda: action([d, c, b, a]), planner=HEAP_ORDER)
    errors = race("SELECT 1 FROM backwave_job WHERE id = %s FOR UPDATE", [b], by_id, by_heap)

    assert errors == []
    assert sorted(by_id.result.changed + by_heap.result.changed) == [a, b, c, d]


def test_overlapping_schedule_toggles_never_deadlock():
    names = ["s-a", "s-b", "s-c", "s-d"]
    a, b, c, d = (make_schedule(name).pk for name in names)
    move_to_the_heap_end("backwave_schedule", "id", [a, b])
    assert heap_order("backwave_schedule", "id", [a, b, c, d]) == [c, d, a, b]
    selection = Schedule.objects.filter(id__in=[a, b, c, d])

    by_id = Operator(lambda: operations.set_schedules_enabled(selection, False), planner=ID_ORDER)
    by_heap = Operator(lambda: operations.set_schedules_enabled(selection, False), planner=HEAP_ORDER)
    errors = race("SELECT 1 FROM backwave_schedule WHERE id = %s FOR UPDATE", [b], by_id, by_heap)

    assert errors == []
    assert by_id.result + by_heap.result == 4
    assert not Schedule.objects.filter(enabled=True).exists()


def test_overlapping_queue_actions_never_deadlock():
    names = ["q-a", "q-b", "q-c", "q-d"]
    Queue.objects.bulk_create([Queue(name=name) for name in names])

    pausing = Operator(lambda: operations.pause_queues(names))
    resuming = Operator(lambda: operations.resume_queues(list(reversed(names))))
    errors = race("SELECT 1 FROM backwave_queue WHERE name = %s FOR UPDATE", ["q-b"], pausing, resuming)

    assert errors == []
    assert (pausing.result, resuming.result) == (4, 4)


def test_a_job_purged_mid_action_is_reported_gone_not_running():
    purged, other = make_job(state="failed").pk, make_job(state="failed").pk

    retry = Operator(lambda: operations.retry_job_ids([purged, other]))
    # The retention purge deletes the row while the action waits for it.
    errors = race("DELETE FROM backwave_job WHERE id = %s", [purged], retry)

    assert errors == []
    assert retry.result.changed == (other,)
    assert dict(retry.result.refused) == {}
    assert retry.result.gone == (purged,)


def test_a_job_claimed_meanwhile_is_reported_as_running():
    job = make_job().pk
    claim = "UPDATE backwave_job SET state = 'running', lease_id = %s, attempts = attempts + 1 WHERE id = %s"

    cancel = Operator(lambda: operations.cancel_job_ids([job]))
    errors = race(claim, [uuid.uuid4(), job], cancel)

    assert errors == []
    assert cancel.result.changed == ()
    assert dict(cancel.result.refused) == {"running": 1}
    assert Job.objects.get(pk=job).state == "running"

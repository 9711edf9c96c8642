"""An application's open transaction never stalls a pump (issue 32, defect 2).

An application may hold a running job's row for as long as its transaction stays open: it
enqueues a job ``after=`` the running one, cancels it, or locks it with ``select_for_update()``,
inside a long ``atomic()``. Beside it a real worker with a 2 s lease runs that job (which reports
progress, as the heartbeat writes it) and a stream of short jobs. Held for three leases, and the
running job finishing meanwhile: the worker keeps its lease, no job lapses or runs twice, the
short jobs' outcomes keep landing (they share batches with the held job's), and the held job's
own outcome lands once the application commits.
"""

from __future__ import annotations

import itertools

import psycopg
import pytest
from django.db import transaction

import backwave
from backwave.models import Job
from backwave.store.contract import NewJob
from backwave.store.postgres import PostgresStore
from tests.shell import worker_tasks

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 2.0
LEASES_HELD = 3
WORKER = ("--queues", "e2e", "--pool-size", "4", "--lease-duration", str(LEASE), "--poll-interval", "0.1")
WORKER += ("--maintenance-interval", "0.5", "--log-every", "0.5")


def database_clock(cursor) -> float:
    return cursor.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]


def hold(mode: str, job_id: int) -> int | None:
    """What the application does to the running job inside its transaction; the dependent's id
    for ``after``."""
    if mode == "after":
        return int(worker_tasks.noop.enqueue(after=[job_id]).id)
    if mode == "cancel":
        backwave.cancel(job_id)
    else:
        Job.objects.select_for_update().get(id=job_id)
    return None


@pytest.mark.parametrize("mode", ["after", "cancel", "select_for_update"])
def test_an_application_transaction_holding_a_running_job_for_three_leases_stalls_nothing(mode, start_worker, tmp_path):
    gate = tmp_path / "gate"
    held_id = int(worker_tasks.reports_until_file.enqueue(str(gate)).id)
    worker = start_worker(*WORKER)
    worker.wait_for(lambda: Job.objects.filter(id=held_id, state="running", progress__isnull=False).exists(), what="the job runs")
    params = {**PostgresStore.from_django()._connect_params, "autocommit": True}
    with psycopg.connect(**params) as observer, PostgresStore.from_django() as enqueuer:
        (lease_before,) = observer.execute("SELECT id FROM backwave_lease").fetchone()
        landed_while_held = 0
        with transaction.atomic():
            dependent_id = hold(mode, held_id)
            held_since = database_clock(observer)
            for round_number in itertools.count():
                held_for = database_clock(observer) - held_since
                if held_for > LEASES_HELD * LEASE:
                    break
                if held_for > LEASE and not gate.exists():
                    # Its progress went on the heartbeats of a whole lease; now it finishes, and
                    # its outcome goes in a batch beside the short jobs'.
                    gate.touch()
                batch = enqueuer.enqueue_many(
                    [
                        NewJob(task_path=worker_tasks.noop.module_path, queue="e2e", payload={"args": [n], "kwargs": {}})
                        for n in range(5)
                    ]
                )
                worker.wait_for(
                    lambda: observer.execute(
                        "SELECT count(*) = %s FROM backwave_job WHERE id = ANY(%s) AND state = 'succeeded'", [len(batch), batch]
                    ).fetchone()[0],
                    what=f"round {round_number} of short jobs lands while the application holds job #{held_id}",
                )
                landed_while_held += len(batch)
            # An enqueue after= it holds nothing the worker waits for: it finished meanwhile, and
            # the dependent is settled at the commit. Held any other way, its outcome waits.
            assert Job.objects.get(id=held_id).state == ("succeeded" if mode == "after" else "running")
        worker.wait_for(
            lambda: Job.objects.filter(id=held_id).exclude(state="running").exists(), what="the held job's outcome lands"
        )
        (lease_after,) = observer.execute("SELECT id FROM backwave_lease").fetchone()
    assert gate.exists() and landed_while_held >= 15
    assert lease_after == lease_before
    # A cancel too: its handler returned before the cancel committed, so nothing stopped it.
    assert Job.objects.get(id=held_id).state == "succeeded"
    if dependent_id is not None:
        worker.wait_for(lambda: Job.objects.filter(id=dependent_id, state="succeeded").exists(), what="the dependent runs")
    assert not Job.objects.filter(attempts__gt=1).exists()  # no job ran twice
    assert not Job.objects.filter(attempt_log__state="lapsed").exists()
    assert "heartbeat failed" not in worker.output
    assert "Traceback" not in worker.output

"""Observers during a rolling deploy, with real worker processes whose registries differ: a
worker that lacks an observer leaves that observer's deliveries to a worker that has it."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from backwave.models import Deliverer, Job, Transition
from tests.faults import tasks
from tests.faults.deploy_observers import SEEN_BY

from .conftest import FAST, faults_env, sql, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = ["tests.shell.worker_tasks", "tests.faults.tasks", "tests.faults.deploy_observers"]
OLDER = MODULES
NEWER = [*MODULES, "tests.faults.deploy_observers_added"]
KEPT, ADDED = "tests.faults.deploy_observers.kept", "tests.faults.deploy_observers_added.added"


def release(modules, poll_interval=0.05) -> dict:
    """A worker's environment for one release of the project: its task (and observer) modules."""
    return faults_env(backwave={"TASK_MODULES": modules, "OBSERVER_POLL_INTERVAL": poll_interval, "OBSERVER_LEASE": 5.0})


@pytest.fixture
def seen_by():
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {SEEN_BY} (observer text, transition_id bigint, job_id bigint, kind text, pid int)")
    yield lambda: sql(f"SELECT observer, job_id FROM {SEEN_BY} ORDER BY observer, job_id")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {SEEN_BY}")


def deliverer_connections() -> int:
    """Connections of other processes to this database whose last statement read the
    transitions: each observer loop's, once it has claimed."""
    (count,) = sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
        ["%UPDATE backwave_transition AS t%"],
    )[0]
    return count


def test_a_worker_without_an_observer_leaves_its_deliveries_to_one_that_has_it(start_worker, seen_by):
    """The older release (only ``kept``) delivers what it knows, fast; the newer one (``kept`` and
    ``added``) runs the jobs, so their transitions are noted for both, then its observer loop
    sleeps. The older worker must not settle ``added``'s part: a newer worker delivers it later."""
    older = start_worker("--queues", "slow", *FAST, env=release(OLDER))  # runs no job of these: only its observer loop matters
    later = timezone.now() + timedelta(hours=1)
    jobs = sorted(int(tasks.work.using(run_after=later).enqueue().id) for _ in range(5))
    newer = start_worker("--queues", "faults", *FAST, env=release(NEWER, poll_interval=3600))
    # Both observer loops have made a claim (the newer one's first pass found nothing, and it now
    # sleeps): only then are the jobs due, so the older worker's loop is the one that finds
    # their transitions.
    wait_until(lambda: deliverer_connections() >= 2, what="both observer loops claiming", workers=[older, newer])
    Job.objects.filter(id__in=jobs).update(run_at=Now())
    wait_until(
        lambda: Job.objects.filter(id__in=jobs, state="succeeded").count() == 5,
        what="the newer worker running the jobs",
        workers=[newer],
    )

    # Seen inside the pass; settled (deleted, or kept for 'added') at its end.
    def delivered_kept():
        seen = [job for name, job in seen_by() if name == "kept"]
        return seen == jobs and not Transition.objects.exclude(delivered_to__contains=[KEPT]).exists()

    wait_until(delivered_kept, what="the older worker delivering 'kept'", workers=[older])
    left = list(Transition.objects.order_by("job_id"))
    assert [(t.job_id, sorted(t.observers), list(t.delivered_to)) for t in left] == [
        (job, sorted([KEPT, ADDED]), [KEPT]) for job in jobs
    ]
    # What the Transitions page reads: the older worker's loop, live, without 'added'.
    (registered,) = [d.observers for d in Deliverer.objects.filter(pid=older.process.pid)]
    assert KEPT in registered and ADDED not in registered

    newer.signal(signal.SIGTERM)  # the newer release's next worker delivers what waits for 'added'
    assert newer.wait() == 0, newer.output
    another = start_worker("--queues", "faults", *FAST, env=release(NEWER))
    wait_until(
        lambda: not Transition.objects.exists(),
        what="the newer worker delivering what was left for 'added'",
        workers=[older, another],
    )
    for worker in (older, another):
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output
    assert seen_by() == [("added", job) for job in jobs] + [("kept", job) for job in jobs]  # each once

"""Effect-once completion and transition observers, with real worker processes.

* A zombie running an atomic task cannot double-apply its writes: SIGSTOP the worker past its
  lease while the handler holds its uncommitted effect row, let another worker finish the job,
  SIGCONT: the zombie's fenced outcome is refused and its effect row rolls back with it. The same
  run with a plain task is the control: its zombie's row landed, two rows.
* An observer that kills its process mid-delivery is delivered again by the next worker, and sees
  each applied transition (one per applied outcome, never the zombie's refused one).
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from backwave.models import Attempt, Job, Transition
from tests.faults import tasks
from tests.faults.observers import CRASH_ONCE, SEEN

from .conftest import FAST, faults_env, sql, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# A dead deliverer's claims lapse after OBSERVER_LEASE: 2 s here, not the default minute.
OBSERVE_FAST = faults_env(
    backwave={"OBSERVER_POLL_INTERVAL": 0.05, "OBSERVER_BACKOFF_BASE": 0.05, "OBSERVER_BACKOFF_MAX": 0.05, "OBSERVER_LEASE": 2.0}
)


@pytest.fixture
def tables():
    """The effect and seen tables the tasks and observers write, dropped after the test."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {tasks.EFFECTS} (job_id bigint NOT NULL, attempt int NOT NULL)")
        cursor.execute(
            f"CREATE TABLE {SEEN} (transition_id bigint, job_id bigint, attempt int, kind text, delivery int, pid int)"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {tasks.EFFECTS}, {SEEN}")


def effects(job_id: int) -> list[int]:
    return [attempt for (attempt,) in sql(f"SELECT attempt FROM {tasks.EFFECTS} WHERE job_id = %s ORDER BY attempt", [job_id])]


def seen() -> list[tuple]:
    return sql(f"SELECT transition_id, job_id, attempt, kind, delivery FROM {SEEN} ORDER BY transition_id, delivery")


@pytest.mark.parametrize(
    ("task", "rows"),
    [
        pytest.param(tasks.atomic_effect, [2], id="atomic: the zombie's writes roll back with its refused outcome"),
        pytest.param(tasks.plain_effect, [1, 2], id="plain (the control): the zombie's writes landed"),
    ],
)
def test_a_zombie_cannot_double_apply_an_atomic_tasks_writes(start_worker, tables, tmp_path, task, rows):
    job = task.enqueue(marker_dir=str(tmp_path))
    job_id = int(job.id)
    zombie = start_worker("--queues", "faults", "--pool-size", "1", "--lease-duration", "1", *FAST, env=OBSERVE_FAST)
    wait_until(lambda: (tmp_path / "inside").exists(), what="the first attempt writing its effect", workers=[zombie])
    zombie.signal(signal.SIGSTOP)

    rescuer = start_worker("--queues", "faults", "--pool-size", "1", *FAST, env=OBSERVE_FAST)
    wait_until(
        lambda: Job.objects.get(id=job.id).state == "succeeded",
        what="the second worker finishing the job",
        workers=[zombie, rescuer],
    )
    (tmp_path / "go").touch()  # the zombie's handler returns as soon as it runs again
    zombie.signal(signal.SIGCONT)
    if task is tasks.atomic_effect:
        wait_until(
            lambda: "the lease fence refused its outcome" in zombie.output, what="the zombie's outcome refused", workers=[zombie]
        )
    else:
        wait_until(lambda: "gave up its lease" in zombie.output, what="the zombie giving its lease up", workers=[zombie])
    for worker in (zombie, rescuer):
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output

    assert effects(job_id) == rows
    finished = Job.objects.get(id=job.id)
    assert (finished.state, finished.attempts, finished.return_value) == ("succeeded", 2, 2)
    assert list(Attempt.objects.filter(job_id=job.id).values_list("state", flat=True)) == ["lapsed", "succeeded"]
    if task is tasks.atomic_effect:
        # The observer saw the lapse and the rescuer's success, never the zombie's refused one.
        assert [(seen_job, attempt, kind) for _, seen_job, attempt, kind, _ in seen()] == [
            (job_id, 1, "lapsed"),
            (job_id, 2, "succeeded"),
        ]
        assert not Transition.objects.exists()  # every transition delivered


def test_an_observer_that_crashes_mid_delivery_is_delivered_again(start_worker, tables, tmp_path):
    """Three jobs, one failing its first attempt: four applied outcomes (a retry, then three
    successes). The first delivery kills its worker after the observer recorded it and before
    the pass was settled; the next worker delivers everything, that one again."""
    jobs = [int(tasks.observed_work.enqueue(fail_first=(n == 0)).id) for n in range(3)]
    marker = tmp_path / "crashed"
    crashing = start_worker(
        "--queues", "faults", "--pool-size", "3", "--lease-duration", "2", *FAST, env={**OBSERVE_FAST, CRASH_ONCE: str(marker)}
    )
    wait_until(lambda: crashing.process.poll() is not None, what="the observer killing its worker", workers=[crashing])
    assert crashing.process.returncode == 9, crashing.output
    assert len(seen()) == 1  # it recorded one delivery, then died before settling it

    # Every job finishes; the next worker's loop delivers what the dead one left.
    survivor = start_worker(
        "--queues", "faults", "--pool-size", "3", "--lease-duration", "2", *FAST, env={**OBSERVE_FAST, CRASH_ONCE: str(marker)}
    )
    applied = lambda: sorted(  # noqa: E731
        # A job still running when the observer killed its worker lapses with it (forgiven, run again).
        (a.job_id, a.number, {"succeeded": "succeeded", "failed": "retried", "lapsed": "lapsed"}[a.state])
        for a in Attempt.objects.filter(job_id__in=jobs)
    )
    wait_until(
        lambda: all(Job.objects.get(id=j).state == "succeeded" for j in jobs) and not Transition.objects.exists(),
        what="every job finished and every transition delivered",
        workers=[survivor],
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output

    outcomes = applied()
    # Without a lapse: job 0 retried then succeeded, the others succeeded at once. A job that ran
    # while the crash took its worker down adds its lapsed attempt (how many depends on timing).
    assert (jobs[0], 1, "retried") in outcomes
    assert [(job, kind) for job, _, kind in outcomes if kind != "lapsed"] == sorted(
        [(jobs[0], "retried"), (jobs[0], "succeeded"), (jobs[1], "succeeded"), (jobs[2], "succeeded")]
    )
    rows = seen()
    # One transition per applied outcome, each seen, none for anything else ...
    by_transition = {}
    for transition_id, job_id, attempt, kind, delivery in rows:
        by_transition.setdefault(transition_id, set()).add((job_id, attempt, kind))
    assert all(len(what) == 1 for what in by_transition.values())
    assert sorted(next(iter(what)) for what in by_transition.values()) == outcomes
    # ... and the delivery the crash cut short, seen again as its second try.
    repeated = [transition_id for transition_id in by_transition if sum(1 for row in rows if row[0] == transition_id) > 1]
    assert len(repeated) == 1 and len(rows) == len(outcomes) + 1
    assert [delivery for transition_id, *_, delivery in rows if transition_id == repeated[0]] == [1, 2]

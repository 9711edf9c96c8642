"""Fail-stop. Fault test 5: a pump forced into an invariant violation halts alone; its sibling
keeps claiming (and inherits the halted pump's jobs once its lease lapses); the health endpoint
and ``manage.py backwave_health`` report it. A group whose every pump halted reads halted: 503,
and the command exits non-zero, while the process keeps serving its other group."""

from __future__ import annotations

import signal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from backwave.models import Job, Pump
from backwave.tasking.task import enqueue_many
from tests.faults import tasks

from .conftest import FAST, faults_env, health_url, http_get, states, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

POISON = tasks.trips_the_driver.module_path


def backwave_health(*args) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("backwave_health", *args, stdout=out)
    except CommandError as error:
        return error.returncode, f"{out.getvalue()}\n{error}"
    return 0, out.getvalue()


def test_5a_one_pump_halts_alone_and_its_sibling_inherits_its_work(start_worker):
    poison = tasks.trips_the_driver.enqueue()
    first = enqueue_many([(tasks.work, (), {}) for _ in range(50)])
    worker = start_worker(
        "--queues",
        "faults",
        "--pumps",
        "2",
        "--pool-size",
        "4",
        "--lease-duration",
        "1",
        "--health-port",
        "0",
        *FAST,
        env=faults_env(halt_on_task=POISON),
    )
    url = health_url(worker)
    wait_until(lambda: "halted; its lease will lapse" in worker.output, what="a pump halting", workers=[worker])
    # The sibling keeps claiming: new work still gets done, and so does the halted pump's, once
    # its lease has lapsed (the poison's second attempt does not trip the driver).
    second = enqueue_many([(tasks.work, (), {}) for _ in range(50)])
    wait_until(lambda: states() == {"succeeded": 101}, what="every job done by the surviving pump", workers=[worker])
    job = Job.objects.get(id=poison.id)
    assert (job.attempts, job.return_value) == (2, "ran after the halt")
    assert len(first) == len(second) == 50

    code, body = http_get(url)
    assert code == 200, body
    assert body["status"] == "degraded" and body["groups"] == {"cli": "degraded"}
    statuses = sorted(p["status"] for p in body["pumps"])
    assert statuses == ["halted", "healthy"]
    (halted,) = [p for p in body["pumps"] if p["status"] == "halted"]
    assert (
        halted["reason"].startswith("InvalidEvent: OutcomesWritten cannot be accepted in state RUNNING") and not halted["alive"]
    )

    row = Pump.objects.get(worker_id=halted["worker_id"])
    assert (row.status, row.reason) == ("halted", halted["reason"])
    code, out = backwave_health()
    assert code == 0, out  # the group is not halted: one pump of two still works
    first_line = out.splitlines()[1]
    assert halted["worker_id"] in first_line and "halted" in first_line and "InvalidEvent" in first_line

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert Pump.objects.filter(status="healthy").count() == 0, "the drained pump deleted its row"


def test_5b_a_group_whose_only_pump_halted_reads_halted(start_worker):
    groups = [
        {"name": "doomed", "queues": ["faults-doomed"], "pumps": 1, "pool_size": 2},
        {"name": "sound", "queues": ["faults"], "pumps": 1, "pool_size": 2},
    ]
    Job.objects.create(task_path=POISON, queue="faults-doomed", payload={"args": [], "kwargs": {}})
    worker = start_worker(
        "--health-port", "0", "--lease-duration", "2", *FAST, env=faults_env(halt_on_task=POISON, worker_groups=groups)
    )
    url = health_url(worker)
    wait_until(lambda: http_get(url)[0] == 503, what="the endpoint answering 503", workers=[worker])
    code, body = http_get(url)
    assert body["status"] == "halted" and body["groups"] == {"doomed": "halted", "sound": "healthy"}

    wait_until(lambda: Pump.objects.filter(group="doomed", status="halted").exists(), what="the halt recorded", workers=[worker])
    code, out = backwave_health()
    assert code == 1 and "group 'doomed' is halted (every pump is)" in out, out
    assert backwave_health("--group", "sound")[0] == 0

    # The process keeps running its other group.
    done = tasks.work.enqueue()
    wait_until(lambda: Job.objects.get(id=done.id).state == "succeeded", what="the sound group still working", workers=[worker])
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_5c_a_process_whose_every_pump_halted_stays_up_and_answers_503(start_worker):
    """Fail-stop halts pumps, not the process: with nothing left healthy it keeps serving its
    health endpoint (503) until it is signalled, then exits 1."""
    groups = [{"name": "doomed", "queues": ["faults-doomed"], "pumps": 1, "pool_size": 2}]
    Job.objects.create(task_path=POISON, queue="faults-doomed", payload={"args": [], "kwargs": {}})
    worker = start_worker(
        "--health-port", "0", "--lease-duration", "2", *FAST, env=faults_env(halt_on_task=POISON, worker_groups=groups)
    )
    url = health_url(worker)
    wait_until(lambda: "the process stays up" in worker.output, what="every pump halted", workers=[worker])
    code, body = http_get(url)
    assert (code, body["status"]) == (503, "halted")
    assert worker.process.poll() is None, "the process is still running"
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 1, worker.output

"""Handler threads keep their Django connections between attempts (a worker thread is not a
web request): with Django's default CONN_MAX_AGE = 0, closing them after every attempt would
open one PostgreSQL session per job."""

from __future__ import annotations

import pytest
from django.db import connection

from backwave.models import Job
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.5")


def test_orm_jobs_open_at_most_one_session_per_handler_thread(start_worker):
    assert connection.settings_dict["CONN_MAX_AGE"] == 0, "this test pins Django's default"
    enqueue_many([(worker_tasks.backend_pid, (), {}) for _ in range(200)])
    worker = start_worker("--queues", "e2e", "--pool-size", "4", "--until-idle", *FAST)
    assert worker.wait() == 0, worker.output
    assert Job.objects.filter(state="succeeded").count() == 200
    sessions = set(Job.objects.values_list("return_value", flat=True))
    assert len(sessions) <= 4, f"200 ORM jobs on 4 handler threads opened {len(sessions)} sessions"


def test_a_connection_past_the_worker_max_age_is_replaced(start_worker):
    enqueue_many([(worker_tasks.backend_pid, (), {}) for _ in range(20)])
    worker = start_worker(
        "--queues", "e2e", "--pool-size", "1", "--until-idle", *FAST, env={"BACKWAVE_TEST_WORKER_CONN_MAX_AGE": "0"}
    )
    assert worker.wait() == 0, worker.output
    # A maximum age of 0 gives each attempt a fresh session, as Django's request cycle would.
    assert len(set(Job.objects.values_list("return_value", flat=True))) == 20

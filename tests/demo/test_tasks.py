"""The demo's task functions, called directly (no worker)."""

import pytest

from project.demo import tasks


def test_fast_job_doubles():
    assert tasks.fast_job.call(21) == 42


def test_slow_job_sleeps_at_most_the_cap(monkeypatch):
    slept = []
    monkeypatch.setattr(tasks.time, "sleep", slept.append)
    assert tasks.slow_job.call(3600) == tasks.SLOW_JOB_MAX_SECONDS
    assert tasks.slow_job.call(-1) == 0
    assert slept == [tasks.SLOW_JOB_MAX_SECONDS, 0]


def test_failing_job_always_raises():
    with pytest.raises(RuntimeError, match="boom"):
        tasks.failing_job.call("boom")


def test_queues():
    assert tasks.report_job.queue_name == "reports"
    assert tasks.email_job.queue_name == "emails"
    assert tasks.fast_job.queue_name == "default"


@pytest.mark.django_db
@pytest.mark.parametrize("probe", [tasks.orm_probe, tasks.sql_probe])
def test_the_benchmark_probes_name_the_session_that_answered(probe):
    # bench/orm_jobs.py counts the sessions a worker's threads opened from these return values.
    from django.db import connection

    assert probe.call(0) == connection.connection.info.backend_pid

"""The demo declares a schedule, so the admin's Schedules page has one to show."""

import pytest
from django.core.management import call_command

import project.settings as project_settings
from backwave.models import Schedule


@pytest.mark.django_db(transaction=True)
def test_the_worker_s_start_writes_the_demo_s_schedule(settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "SCHEDULES": project_settings.BACKWAVE.get("SCHEDULES", {})}
    # --until-idle: the worker syncs its schedules at start, finds nothing to run and ends.
    call_command("backwave_worker", "--queues", "reports", "--no-hints", "--until-idle")

    schedule = Schedule.objects.get(name="demo-report")
    assert (schedule.task_path, schedule.cron, schedule.queue, schedule.enabled) == (
        "project.demo.tasks.report_job",
        "*/5 * * * *",
        "reports",
        True,
    )

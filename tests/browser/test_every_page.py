"""Every page of the BackWave admin renders in a real browser with something on it, and leaves a
screenshot under artifacts/screenshots/: the pages the other browser tests do not already draw
(Schedules, a schedule, Transitions with a dead delivery, Task statistics, Queues, the index)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from backwave.models import Schedule, Transition

from .conftest import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def expect():
    from playwright.sync_api import expect

    return expect


def test_every_page_renders_in_the_browser(page, live_server, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    nightly = Schedule.objects.create(
        name="nightly-report",
        task_path="project.demo.tasks.report_job",
        cron="0 3 * * *",
        next_run=datetime(2030, 1, 2, 3, tzinfo=UTC),
        last_slot=datetime(2030, 1, 1, 3, tzinfo=UTC),
    )
    Transition.objects.create(
        job_id=41,
        attempt=3,
        kind="failed",
        task_path="project.demo.tasks.failing_job",
        queue="default",
        state="dead",
        deliveries=8,
        failed_observer="project.observers.page_someone",
        last_error="ConnectionRefusedError: [Errno 111] Connection refused",
    )
    log_in(page, live_server, "boss", "pw")

    pages = {
        "admin-index": (reverse("admin:app_list", args=["backwave"]), "BackWave"),
        "schedules": (reverse("admin:backwave_schedule_changelist"), "nightly-report"),
        "schedule": (reverse("admin:backwave_schedule_change", args=[nightly.pk]), "0 3 * * *"),
        "transitions": (reverse("admin:backwave_transition_changelist"), "page_someone"),
        "task-statistics-empty": (reverse("admin:backwave_taskstat_changelist"), "statistics"),
    }
    for name, (url, text) in pages.items():
        response = page.goto(f"{live_server.url}{url}")
        assert response is not None and response.status == 200, (name, response and response.status)
        expect()(page.locator("#content")).to_contain_text(text)
        screenshot(page, name)

"""The dashboard and the live pages in a real browser: a real worker runs jobs (some fail), its
maintenance rolls the statistics up, and the operator reads health, charts, failures and per-task
numbers without a click; the pages then refresh themselves, and hold still while rows are
selected."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from backwave.models import Attempt, Job, TaskStat
from backwave.tasking.task import enqueue_many
from tests.admin.conftest import make_job, make_pump
from tests.shell import worker_tasks

from .conftest import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKER_ARGS = (
    "--queues",
    "e2e",
    "--pool-size",
    "4",
    "--poll-interval",
    "0.1",
    "--maintenance-interval",
    "0.3",
    "--log-every",
    "1",
)


def expect():
    from playwright.sync_api import expect

    return expect


def test_the_dashboard_answers_is_it_healthy_what_is_stuck_what_failed_and_why(page, live_server, start_worker, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(40)] + [(worker_tasks.always_fails, (), {}) for _ in range(3)])
    worker = start_worker(*WORKER_ARGS)
    worker.wait_for(lambda: Job.objects.filter(state__in=["succeeded", "failed"]).count() == 43, what="all 43 jobs finished")
    # 40 + 3 x 2 attempts, rolled up by the worker's own maintenance (two runs after they committed).
    worker.wait_for(
        lambda: sum(TaskStat.objects.filter(resolution=60).values_list("succeeded", flat=True)) == 40, what="the rollup"
    )

    log_in(page, live_server, "boss", "pw")
    page.goto(f"{live_server.url}/admin/backwave/")
    expect()(page.locator("#bw-verdict")).to_contain_text("Healthy.")
    expect()(page.locator("#bw-card-pumps [data-status=healthy]")).to_have_text("1 healthy")
    expect()(page.locator("#bw-card-hints")).to_contain_text("1 listener session for 1 worker process")
    expect()(page.locator("#bw-card-maintenance")).to_contain_text("Last run")
    chart = page.locator("#bw-chart-throughput")
    expect()(chart.locator("title").first).to_contain_text("Finished attempts: 40 succeeded, 6 not succeeded (per minute)")
    assert chart.locator("rect.bw-ok").count() >= 1 and chart.locator("text.bw-axis").count() >= 4  # bars and axis labels
    failures = page.locator("#bw-dash-failures tbody tr")
    expect()(failures).to_have_count(6)
    expect()(failures.first).to_contain_text("ValueError: this task always fails")
    expect()(page.locator("#bw-dash-stuck")).to_contain_text("Nothing is stuck.")
    expect()(page.locator("#bw-dash-queue-e2e")).to_contain_text("e2e")
    screenshot(page, "dashboard-1h")
    page.click("a.bw-range >> text=24h")
    expect()(page.locator("#bw-chart-throughput title").first).to_contain_text("(per hour)")
    screenshot(page, "dashboard-24h")

    page.goto(f"{live_server.url}/admin/backwave/taskstat/?range=1h")
    lines = page.locator("#task-stats tr.task-line")
    expect()(lines).to_have_count(2)
    noop = page.locator("#task-stats tr.task-line", has_text="worker_tasks.noop")
    expect()(noop.locator("td.succeeded")).to_have_text("40")
    fails = page.locator("#task-stats tr.task-line", has_text="worker_tasks.always_fails")
    expect()(fails.locator("td.retried")).to_have_text("3")
    expect()(fails.locator("td.failed")).to_have_text("3")
    expect()(fails.locator("td.failure-rate")).to_have_text("100 %")
    screenshot(page, "task-statistics")
    page.goto(f"{live_server.url}/admin/backwave/queue/")
    screenshot(page, "queues-live")
    assert Attempt.objects.count() == 46


def test_pages_refresh_themselves_and_hold_still_while_rows_are_selected(page, live_server, screenshot, settings):
    settings.BACKWAVE = {**getattr(settings, "BACKWAVE", {}), "ADMIN_REFRESH_SECONDS": 1}
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    make_pump("node-1:1:default:0:aa")
    log_in(page, live_server, "boss", "pw")

    # The dashboard: a pump halts elsewhere; the verdict changes without a reload.
    page.goto(f"{live_server.url}/admin/backwave/")
    page.evaluate("window.bwNotReloaded = true")
    make_pump("node-2:2:default:0:bb", "halted", reason="InvalidEvent: the driver refused an event", lease_expires_in=None)
    expect()(page.locator("#bw-verdict")).to_contain_text("1 pump halted.")
    assert page.evaluate("window.bwNotReloaded") is True
    screenshot(page, "dashboard-live-halted")

    # The jobs list: a new job appears on its own ...
    first = make_job(queue="mail")
    page.goto(f"{live_server.url}/admin/backwave/job/")
    page.evaluate("window.bwNotReloaded = true")
    rows = page.locator("#result_list tbody tr")
    expect()(rows).to_have_count(1)
    make_job(queue="mail")
    expect()(rows).to_have_count(2)
    assert page.evaluate("window.bwNotReloaded") is True
    live = page.locator("[data-bw-live]")
    refreshes = int(live.get_attribute("data-bw-live-refreshes"))
    # ... Django's action script still works on the swapped-in rows ...
    page.check("#action-toggle")
    expect()(page.locator(".action-counter")).to_contain_text("2 of 2 selected")
    page.uncheck("#action-toggle")
    # ... and while a row is selected, nothing moves.
    page.check(f"input.action-select[value='{first.pk}']")
    expect()(live.locator("[data-bw-live-status]")).to_have_text("paused while rows are selected")
    skipped = int(live.get_attribute("data-bw-live-skipped") or 0)
    make_job(queue="mail")
    # Two refreshes come and go (counted, not timed) while the new job waits in the database.
    page.wait_for_function(f"Number(document.querySelector('[data-bw-live]').dataset.bwLiveSkipped) >= {skipped + 2}")
    expect()(rows).to_have_count(2)
    assert page.is_checked(f"input.action-select[value='{first.pk}']")
    screenshot(page, "jobs-live-paused")
    page.uncheck(f"input.action-select[value='{first.pk}']")
    expect()(rows).to_have_count(3)
    assert int(live.get_attribute("data-bw-live-refreshes")) > refreshes
    # The Pause button holds it by hand.
    page.click("[data-bw-live-toggle]")
    expect()(live.locator("[data-bw-live-status]")).to_have_text("paused")
    make_job(queue="mail")
    page.goto(f"{live_server.url}/admin/backwave/pump/")
    expect()(page.locator("#result_list tbody tr")).to_have_count(2)
    screenshot(page, "pumps-live")

"""An operator's day, in a real browser against a live server and a real worker process."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User

from backwave.models import Attempt, Job, Pump

from tests.factories import make_lease

from .conftest import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKER_ARGS = (
    "--queues",
    "default,emails,reports",
    "--pool-size",
    "8",
    "--poll-interval",
    "0.1",
    "--maintenance-interval",
    "0.5",
    "--log-every",
    "1",
)


def expect():
    from playwright.sync_api import expect

    return expect


def enqueue_from_the_demo(page, live_server, count: int, kind: str) -> str:
    page.goto(f"{live_server.url}/")
    page.fill("#id_count", str(count))
    page.check(f"input[name=kind][value={kind}]")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/runs/.+/$"))
    return page.url


def wait_until_finished(page):
    """The run page refreshes itself every second until every job has finished."""
    expect()(page.locator("p.lead")).to_contain_text("All finished", timeout=30_000)


def test_enqueue_follow_fail_and_retry_as_an_operator(page, live_server, start_worker, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    worker = start_worker(*WORKER_ARGS)
    log_in(page, live_server, "boss", "pw")

    # Enqueue from the demo and see the jobs complete.
    enqueue_from_the_demo(page, live_server, 25, "fast")
    wait_until_finished(page)
    expect()(page.locator("#count-succeeded b")).to_have_text("25")
    screenshot(page, "demo-run")

    # A failing job: three attempts, each with its traceback on the job's admin page.
    enqueue_from_the_demo(page, live_server, 1, "failing")
    wait_until_finished(page)
    expect()(page.locator("#count-failed b")).to_have_text("1")
    page.click("td.num a")  # the job's link into the admin
    expect()(page.locator("#job-state")).to_have_text("Failed")
    expect()(page.locator("tr.attempt-failed")).to_have_count(3)
    expect()(page.locator("pre.traceback").last).to_contain_text("RuntimeError: demo failure #1")
    expect()(page.locator("code.error-class").first).to_have_text("builtins.RuntimeError")
    screenshot(page, "job")

    # Retry it as a permitted user: one more attempt, which fails again.
    job_id = Job.objects.get(state="failed").pk
    page.select_option("select[name='CHANGE_FORM-action']", "retry_now")
    page.click("#content-main .actions button[type=submit]")
    expect()(page.locator("ul.messagelist")).to_contain_text("Retried 1 job.")
    worker.wait_for(lambda: Attempt.objects.filter(job_id=job_id).count() == 4, what="the retried attempt")
    page.reload()
    expect()(page.locator("#job-state")).to_have_text("Failed")
    expect()(page.locator("tr.attempt-failed")).to_have_count(4)

    # The Queues page, reached from the demo's header: the default queue's finished jobs in the
    # sparkline, nothing left ready.
    page.goto(f"{live_server.url}/")
    page.click("header nav a:text('Queues')")
    line = page.locator("#queue-default")
    expect()(line.locator("td.failed")).to_have_text("1")
    expect()(line.locator("td.ready")).to_have_text("0")
    expect()(line.locator("td.throughput")).to_have_text("26")  # jobs finished in the last hour: 25 + 1
    expect()(line.locator("svg.bw-spark polyline")).to_have_count(1)
    # Pause one queue and limit another from the page.
    page.check("#queue-emails input[type=checkbox]")
    page.select_option("#queue-action", "pause")
    page.click("#queue-run")
    expect()(page.locator("ul.messagelist")).to_contain_text("Paused 1 queue: emails.")
    page.check("#queue-reports input[type=checkbox]")
    page.select_option("#queue-action", "set_limit")
    page.fill("#queue-limit", "4")
    page.click("#queue-run")
    expect()(page.locator("ul.messagelist")).to_contain_text("1 queue now at most 4 running at once: reports.")
    expect()(page.locator("#queue-emails td.paused-flag")).to_have_text("Paused")
    expect()(page.locator("#queue-reports td.limit")).to_have_text("4")
    screenshot(page, "queues")

    # Jobs list filtered by state.
    page.goto(f"{live_server.url}/admin/backwave/job/?state=failed")
    expect()(page.locator("#result_list tbody tr")).to_have_count(1)
    screenshot(page, "jobs-failed")


def test_a_read_only_user_sees_but_is_refused(page, live_server, screenshot):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(content_type__app_label="backwave", codename__startswith="view_"))
    job = Job.objects.create(
        task_path="project.demo.tasks.failing_job",
        payload={"args": ["x"], "kwargs": {}},
        state="failed",
        attempts=1,
        max_attempts=1,
    )
    Attempt.objects.create(
        job=job,
        number=1,
        state="failed",
        worker_id="node:1:default:0",
        error_class="builtins.RuntimeError",
        traceback="Traceback (most recent call last):\nRuntimeError: x",
    )
    log_in(page, live_server, "viewer", "pw")

    page.goto(f"{live_server.url}/admin/backwave/job/{job.pk}/change/")
    expect()(page.locator("pre.traceback")).to_contain_text("RuntimeError: x")
    expect()(page.locator("#job-retry-refused")).to_be_visible()
    expect()(page.locator("select[name='CHANGE_FORM-action']")).to_have_count(0)

    # Even a hand-made request is refused.
    status = page.evaluate(
        """async (jobId) => {
            const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1];
            const body = new URLSearchParams({csrfmiddlewaretoken: token, action: 'retry_now', index: '0', _selected_action: jobId});
            const response = await fetch('/admin/backwave/job/', {method: 'POST', body, credentials: 'same-origin'});
            return response.status;
        }""",
        str(job.pk),
    )
    assert status == 403
    assert Job.objects.get(pk=job.pk).state == "failed"

    page.goto(f"{live_server.url}/admin/backwave/queue/")
    expect()(page.locator("#queue-action")).to_have_count(0)
    expect()(page.locator("table#queues")).to_be_visible()


def test_a_halted_pump_shows_in_the_banner_and_first_on_the_pumps_page(page, live_server, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    Pump.objects.create(
        worker_id="node-2:711:default:0:9f2c",
        group="default",
        hostname="node-2",
        pid=711,
        status="healthy",
        in_flight=12,
        lease_duration=30,
    )
    Pump.objects.create(
        worker_id="node-2:711:default:1:4be1",
        group="default",
        hostname="node-2",
        pid=711,
        status="halted",
        reason="DriverError: ClaimReturned is not accepted in state draining",
        in_flight=0,
        lease_duration=30,
    )
    Pump.objects.create(
        worker_id="node-3:90:reports:0:77aa",
        group="reports",
        hostname="node-3",
        pid=90,
        status="degraded",
        reason="OperationalError: connection refused (retrying)",
        in_flight=2,
        lease_duration=30,
    )
    # Running pumps hold a lease; the halted one let its lease lapse.
    make_lease("node-2:711:default:0:9f2c", group="default", hostname="node-2", pid=711)
    make_lease("node-3:90:reports:0:77aa", group="reports", hostname="node-3", pid=90)
    log_in(page, live_server, "boss", "pw")

    for path in ("/admin/backwave/", "/admin/backwave/queue/", "/admin/backwave/job/", "/admin/backwave/schedule/"):
        page.goto(f"{live_server.url}{path}")
        expect()(page.locator("#backwave-halted-banner")).to_contain_text("A pump is halted.")
        expect()(page.locator("#backwave-halted-banner")).to_contain_text("ClaimReturned is not accepted")

    page.click("#backwave-halted-banner a")
    rows = page.locator("#result_list tbody tr")
    expect()(rows).to_have_count(1)
    page.goto(f"{live_server.url}/admin/backwave/pump/")
    expect()(rows).to_have_count(3)
    expect()(rows.nth(0)).to_contain_text("Halted")
    expect()(rows.nth(0)).to_contain_text("DriverError")
    expect()(rows.nth(1)).to_contain_text("Degraded")
    expect()(rows.nth(2)).to_contain_text("Healthy")
    screenshot(page, "pumps")

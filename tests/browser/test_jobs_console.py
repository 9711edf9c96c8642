"""The Jobs list and job page in headless Chromium: retry all under a filter (the confirmation
page, then the batches), redaction, the time zone (the browser's, then the server's), and the
traceback's folded frames. Screenshots under artifacts/screenshots/."""

from __future__ import annotations

import re
from datetime import datetime, timezone as dt_timezone

import pytest

from backwave.ops import actions as operations
from backwave.models import Job
from tests.admin.conftest import ACTION_PERMISSIONS, VIEW_PERMISSIONS, make_attempt, make_job, staff_user

from .conftest import TIMEOUT_MS, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECRET = "sk-live-7f3a9c"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/.venv/lib/python3.12/site-packages/backwave/shell/execution.py", line 180, in run\n'
    "    result = task.call(*args, **kwargs)\n"
    '  File "/srv/app/shop/tasks.py", line 14, in send_receipt\n'
    "    mailer.send(order)\n"
    '  File "/srv/app/.venv/lib/python3.12/site-packages/django/core/mail/message.py", line 301, in send\n'
    "    return self.get_connection(fail_silently).send_messages([self])\n"
    "smtplib.SMTPRecipientsRefused: {'ann@example.com': (550, b'mailbox full')}\n"
)


def expect():
    from playwright.sync_api import expect

    return expect


@pytest.fixture
def operator(db):
    return staff_user("operator", VIEW_PERMISSIONS + ACTION_PERMISSIONS)  # password "pw"


@pytest.fixture
def zoned_page(browser):
    """A page whose browser runs in Asia/Tokyo while the server renders in UTC (TIME_ZONE)."""
    context = browser.new_context(viewport={"width": 1500, "height": 900}, timezone_id="Asia/Tokyo")
    context.set_default_timeout(TIMEOUT_MS)
    yield context.new_page()
    context.close()


def failing(queue: str, n: int) -> Job:
    job = make_job(
        state="failed",
        queue=queue,
        task_path="shop.tasks.send_receipt",
        attempts=1,
        tags=["tenant:7"],
        payload={"args": [], "kwargs": {"order_id": 1000 + n, "smtp_password": SECRET}},
        worker_id="web-1:311:default:0",
    )
    make_attempt(job, 1, "failed", error_class="smtplib.SMTPRecipientsRefused", traceback=TRACEBACK)
    return job


def test_retry_all_under_a_filter(page, live_server, operator, screenshot, monkeypatch):
    monkeypatch.setattr(operations, "BATCH_SIZE", 3)  # the live server runs in this process
    emails = [failing("emails", n) for n in range(7)]
    reports = [failing("reports", n) for n in range(2)]
    make_job(queue="emails")  # ready: not touched by a retry
    log_in(page, live_server, "operator", "pw")
    page.goto(f"{live_server.url}/admin/backwave/job/?queue=emails&state=failed")
    page.click("#toggle-nav-sidebar")  # as an operator on a laptop would: the list gets the width
    page.reload()
    expect()(page.locator("#result_list tbody tr")).to_have_count(7)
    expect()(page.locator("#result_list .field-error_shown").first).to_contain_text("SMTPRecipientsRefused")
    screenshot(page, "jobs-list-filtered")

    page.click("#bw-retry-all")
    expect()(page.locator("#bw-bulk-count strong").first).to_have_text("7")
    expect()(page.locator("#bw-bulk-filters")).to_have_text("queue=emails, state=failed")
    screenshot(page, "jobs-retry-all-confirmation")

    page.click("#bw-bulk-confirm")
    expect()(page.locator("ul.messagelist")).to_contain_text("Retried 7 jobs.")
    expect()(page.locator("ul.messagelist")).to_contain_text("Done in 3 batches of up to 3 jobs")
    assert "queue=emails" in page.url and "state=failed" in page.url  # back on the same filter
    expect()(page.locator("#result_list tbody tr")).to_have_count(0)
    screenshot(page, "jobs-retry-all-done")

    assert set(Job.objects.filter(pk__in=[j.pk for j in emails]).values_list("state", flat=True)) == {"ready"}
    assert set(Job.objects.filter(pk__in=[j.pk for j in reports]).values_list("state", flat=True)) == {"failed"}

    # The job's history names who retried it.
    page.goto(f"{live_server.url}/admin/backwave/job/{emails[0].pk}/history/")
    expect()(page.locator("#change-history")).to_contain_text("operator")
    expect()(page.locator("#change-history")).to_contain_text("by “retry all matching” (queue=emails, state=failed)")


def test_redaction_in_the_list_the_page_and_the_search(page, live_server, operator, screenshot):
    job = failing("emails", 1)
    log_in(page, live_server, "operator", "pw")

    page.goto(f"{live_server.url}/admin/backwave/job/{job.pk}/change/")
    expect()(page.locator(".field-payload_json pre")).to_contain_text('"smtp_password": "********************"')
    expect()(page.locator(".field-payload_json pre")).to_contain_text('"order_id": 1001')
    assert SECRET not in page.content()
    screenshot(page, "job-page-redacted")

    page.goto(f"{live_server.url}/admin/backwave/job/")
    page.fill("#searchbar", f"smtp_password={SECRET}")
    page.press("#searchbar", "Enter")
    expect()(page.locator("ul.messagelist")).to_contain_text(
        "'smtp_password' is redacted (BACKWAVE['REDACT_KEYS']) and cannot be searched for."
    )
    expect()(page.locator("#result_list tbody tr")).to_have_count(0)
    screenshot(page, "jobs-search-redacted-refused")

    page.fill("#searchbar", "order_id=1001 tag:tenant:7")
    page.press("#searchbar", "Enter")
    expect()(page.locator("#result_list tbody tr")).to_have_count(1)
    assert SECRET not in page.content()


def test_times_in_the_browsers_zone_then_the_servers(zoned_page, live_server, operator, screenshot):
    page = zoned_page
    job = failing("emails", 2)
    Job.objects.filter(pk=job.pk).update(finished_at=datetime(2026, 3, 1, 12, 0, 5, tzinfo=dt_timezone.utc))
    log_in(page, live_server, "operator", "pw")

    page.goto(f"{live_server.url}/admin/backwave/job/")
    finished = page.locator("#result_list .field-finished time")
    expect()(page.locator("#bw-time-zone .bw-zone-name")).to_have_text("Asia/Tokyo (your browser's time zone)")
    expect()(finished).to_have_text("03-01 21:00:05")  # 12:00:05 UTC
    assert "Asia/Tokyo" in finished.get_attribute("title") and "UTC" in finished.get_attribute("title")
    screenshot(page, "jobs-list-browser-time-zone")

    page.click("#bw-time-zone button")
    expect()(page.locator("#bw-time-zone .bw-zone-name")).to_have_text("UTC (the server's time zone)")
    expect()(finished).to_have_text("03-01 12:00:05")
    page.reload()  # the choice is remembered
    expect()(page.locator("#result_list .field-finished time")).to_have_text("03-01 12:00:05")
    page.click("#bw-time-zone button")
    expect()(page.locator("#result_list .field-finished time")).to_have_text("03-01 21:00:05")

    # The job page: precise times, in the same zone.
    page.goto(f"{live_server.url}/admin/backwave/job/{job.pk}/change/")
    expect()(page.locator("#bw-time-zone .bw-zone-name")).to_contain_text("Asia/Tokyo")
    expect()(page.locator(".fieldBox.field-finished time")).to_have_text("03-01 21:00:05")
    started = page.locator(".attempt-started time")
    expect()(started).to_have_text(re.compile(r"^\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$"))
    assert "Asia/Tokyo" in started.get_attribute("title")
    screenshot(page, "job-page-browser-time-zone")


def test_the_job_page_folds_backwaves_and_djangos_frames(page, live_server, operator, screenshot):
    job = failing("emails", 3)
    log_in(page, live_server, "operator", "pw")
    page.goto(f"{live_server.url}/admin/backwave/job/{job.pk}/change/")

    traceback = page.locator("pre.traceback").last
    expect()(traceback).to_contain_text('File "/srv/app/shop/tasks.py", line 14, in send_receipt')
    expect()(page.locator(".bw-machinery").first).to_be_hidden()
    expect()(page.locator(".error-message")).to_have_text("{'ann@example.com': (550, b'mailbox full')}")
    # Only what applies to a failed job is offered.
    options = page.locator("select[name='CHANGE_FORM-action'] option").all_inner_texts()
    assert options[1:] == ["Retry now (failed, quarantined or held jobs)"]  # after the blank choice
    screenshot(page, "job-page-frames-folded")

    page.check(".bw-tb-toggle")
    expect()(page.locator(".bw-machinery").first).to_be_visible()
    expect()(traceback).to_contain_text("site-packages/django/core/mail/message.py")
    screenshot(page, "job-page-frames-shown")

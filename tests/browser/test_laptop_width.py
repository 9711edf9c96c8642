"""Every BackWave page at a laptop's width (1280 and 1024 px): none scrolls sideways, whatever
its rows hold (long task paths, worker ids, errors, many queues); a table wider than the content
scrolls inside its own box. And every page shows its times in one format, the Jobs page's."""

from __future__ import annotations

from datetime import UTC, datetime

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from backwave.models import Pump, Queue, Schedule
from tests.admin.conftest import make_attempt, make_job, make_pump

from .conftest import TIMEOUT_MS, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LONG_TASK = "shop.integrations.fulfilment.warehouse_partners.tasks.synchronise_inventory_levels_for_partner"
LONG_ERROR = (
    "ConnectionRefusedError: [Errno 111] Connection refused while talking to "
    + "warehouse-partner-api.internal.example.com:8443/v2/inventory/" * 3
)
# The attempts table adds milliseconds to the same format (attempts can be milliseconds apart).
COMPACT_TIME = re.compile(r"^\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{3})?$")
WORKER = "ip-10-20-30-40.eu-central-1.compute.internal:123456:default-with-a-long-group-name:15"


@pytest.fixture
def pages(db):
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    for n in range(12):
        Queue.objects.create(name=f"partner-queue-number-{n:02d}-with-a-long-name", concurrency_limit=n + 1, paused=n % 2 == 0)
    job = None
    for n in range(8):
        job = make_job(
            state="failed",
            queue=f"partner-queue-number-{n:02d}-with-a-long-name",
            task_path=LONG_TASK,
            attempts=3,
            tags=["tenant:acme-corporation-international", "partner:warehouse"],
            worker_id=WORKER,
            payload={"args": [], "kwargs": {"partner": "x" * 200}},
        )
        for number in (1, 2, 3):
            make_attempt(
                job,
                number,
                "failed",
                worker_id=WORKER,
                error_class="builtins.ConnectionRefusedError",
                traceback=f'Traceback (most recent call last):\n  File "/srv/app/tasks.py", line 1\n{LONG_ERROR}\n',
            )
    Schedule.objects.create(
        name="nightly-inventory-synchronisation-for-every-partner",
        task_path=LONG_TASK,
        cron="0 3 * * *",
        queue="partner-queue-number-00-with-a-long-name",
        next_run=datetime(2030, 1, 2, 3, tzinfo=UTC),
        last_slot=datetime(2030, 1, 1, 3, tzinfo=UTC),
    )
    make_pump(WORKER, status="halted", reason=LONG_ERROR)
    make_pump(WORKER.replace(":15", ":16"))
    return {
        "dashboard": reverse("admin:app_list", args=["backwave"]),
        "jobs": reverse("admin:backwave_job_changelist"),
        "job": reverse("admin:backwave_job_change", args=[job.pk]),
        "queues": reverse("admin:backwave_queue_changelist"),
        "schedules": reverse("admin:backwave_schedule_changelist"),
        "pumps": reverse("admin:backwave_pump_changelist"),
        "task-statistics": reverse("admin:backwave_taskstat_changelist"),
    }


@pytest.mark.parametrize("width", [1280, 1024])
def test_no_page_scrolls_sideways(browser, live_server, pages, width, screenshot):
    """At 1280 px the Queues page was 1,540 px wide; the Jobs and Schedules tables ran under the
    filter sidebar's edge, and the job page's attempts table past the page."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        log_in(page, live_server, "boss", "pw")
        wide = {}
        for name, url in pages.items():
            response = page.goto(f"{live_server.url}{url}")
            assert response is not None and response.status == 200, (name, response and response.status)
            # The test settings have two databases: every page opens with the switch between them.
            assert page.locator("#bw-database-switch").is_visible(), name
            scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            if scroll > client:
                wide[name] = (
                    scroll,
                    page.evaluate(
                        """(w) => [...document.querySelectorAll('body *')]
                    .filter(e => e.getBoundingClientRect().right > w + 1 && ![...e.children].some(c => c.getBoundingClientRect().right > w + 1))
                    .slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""",
                        client,
                    ),
                )
            # Nothing of the content runs under the sidebar or past the content's edge.
            overflow = page.evaluate("""() => {
                const content = document.querySelector('#content-main') || document.querySelector('#content');
                const edge = content.getBoundingClientRect().right + 1;
                const filter = document.querySelector('#changelist-filter');
                const limit = filter ? Math.min(edge, filter.getBoundingClientRect().left + 1) : edge;
                const scrolls = (t) => {  // inside a box of its own that scrolls sideways, within the limit
                    for (let box = t.parentElement; box && box !== content.parentElement; box = box.parentElement) {
                        if (['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) return box.getBoundingClientRect().right <= limit;
                    }
                    return false;
                };
                return [...content.querySelectorAll('table')].filter(t => !t.closest('#changelist-filter'))
                    .filter(t => t.getBoundingClientRect().right > limit && !scrolls(t)).map(t => t.id || t.className || 'table');
            }""")
            if overflow:
                wide[f"{name}: tables past the content's edge"] = overflow
            screenshot(page, f"laptop-{width}-{name}")
        assert wide == {}, f"pages wider than {width} px: {wide}"
    finally:
        context.close()


def test_every_page_shows_times_in_the_jobs_pages_format(page, live_server, pages):
    """The Jobs page said 12-06 01:13:42, the Schedules and Pumps pages Dec. 6, 2026, 1:15 a.m., and the
    job page's attempts 2026-12-06 01:13:42.093 beside its own 12-06 01:13:42."""
    log_in(page, live_server, "boss", "pw")
    schedule, pump = Schedule.objects.get(), Pump.objects.order_by("worker_id").first()
    for url in (
        pages["jobs"],
        pages["job"],
        pages["schedules"],
        reverse("admin:backwave_schedule_change", args=[schedule.pk]),
        reverse("admin:backwave_pump_change", args=[pump.pk]),
    ):
        page.goto(f"{live_server.url}{url}")
        page.wait_for_load_state("load")  # local_times.js has shown them in the browser's zone
        texts = page.locator("#content time[data-bw-time]").all_inner_texts()
        assert texts, url
        assert all(COMPACT_TIME.match(text) for text in texts), (url, texts)
        content = page.locator("#content").inner_text()
        assert not re.search(r"\b(a\.m\.|p\.m\.|midnight|noon)\b", content), (url, "Django's default DATETIME_FORMAT")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_database_switch_shows_the_other_database_at_1024_px(browser, live_server):
    from tests.shell.worker_tasks import noop

    User.objects.create_superuser("boss", "boss@example.com", "pw")
    noop.enqueue(1)
    remote = noop.using(backend="remote", queue_name="remote").enqueue(2)
    context = browser.new_context(viewport={"width": 1024, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        log_in(page, live_server, "boss", "pw")
        jobs = reverse("admin:backwave_job_changelist")
        page.goto(f"{live_server.url}{jobs}")
        page.select_option("#bw-database", "other")
        with page.expect_navigation():
            page.click("#bw-database-switch button[type=submit]")
        assert page.url == f"{live_server.url}{jobs}"
        assert page.locator("#bw-database").input_value() == "other"
        rows = page.locator("#result_list tbody tr").all_inner_texts()
        assert len(rows) == 1 and rows[0].split()[0] == remote.id
        page.goto(f"{live_server.url}{reverse('admin:backwave_queue_changelist')}")
        assert page.locator("#bw-database").input_value() == "other"  # kept in the session
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client
    finally:
        context.close()

"""The Pumps page after a real worker process is killed with SIGKILL: its row, which still says
what the pump last reported (healthy), is shown lost, in red, first; its jobs are counted live."""

from __future__ import annotations

import signal

import pytest
from django.contrib.auth.models import User
from django.db.models.functions import Now

from backwave.models import Job, Lease, Pump
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

from .conftest import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The killed worker's lease lapses two seconds after its last renewal; nobody's maintenance runs
# again after its start, so its jobs stay under the lapsed lease, as until a peer expires it.
FAST = ("--poll-interval", "0.1", "--maintenance-interval", "3600", "--no-hints")
RED = "rgb(253, 226, 225)"  # .bw-lost, as .bw-halted


def expect():
    from playwright.sync_api import expect

    return expect


def test_a_worker_killed_with_sigkill_is_shown_lost_in_red_first_with_its_jobs(page, live_server, start_worker, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", "pw")
    enqueue_many([(worker_tasks.sleeper, (120,), {}) for _ in range(3)])
    doomed = start_worker("--queues", "slow", "--pool-size", "4", "--lease-duration", "2", *FAST)
    doomed.wait_for(
        lambda: Job.objects.filter(state="running").count() == 3 and Pump.objects.count() == 1, what="three jobs running"
    )
    (killed,) = Pump.objects.values_list("worker_id", flat=True)
    survivor = start_worker("--queues", "e2e", "--pool-size", "1", *FAST)
    survivor.wait_for(lambda: Pump.objects.count() == 2, what="a second, healthy pump")

    doomed.signal(signal.SIGKILL)
    doomed.process.wait()
    survivor.wait_for(
        lambda: not Lease.objects.filter(worker_id=killed, expires_at__gt=Now()).exists(), what="the killed pump's lease lapsing"
    )
    assert Pump.objects.get(worker_id=killed).status == "healthy", "its row still says what it last reported"

    log_in(page, live_server, "boss", "pw")
    page.goto(f"{live_server.url}/admin/backwave/pump/")
    rows = page.locator("#result_list tbody tr")
    expect()(rows).to_have_count(2)
    expect()(rows.nth(0)).to_contain_text(killed)
    badge = rows.nth(0).locator(".bw-badge")
    expect()(badge).to_have_text("Lost")
    expect()(badge).to_have_css("background-color", RED)
    expect()(rows.nth(0).locator("td.field-in_flight_shown")).to_have_text("3")
    expect()(rows.nth(1)).to_contain_text("Healthy")
    expect()(rows.nth(1).locator("td.field-in_flight_shown")).to_have_text("0")
    screenshot(page, "pumps-lost")

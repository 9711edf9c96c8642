"""The demo, end to end in one test: a view enqueues, the test pump runs the jobs, the run page
reports them. Retries come due by advancing the virtual clock, not by sleeping."""

from __future__ import annotations

import pytest
from django.urls import reverse

from backwave.models import Attempt, Job

pytestmark = pytest.mark.django_db


def test_failing_jobs_retry_and_die_on_virtual_time(client, backwave_pump, backwave_jobs):
    response = client.post(reverse("demo:home"), {"count": 3, "kind": "failing"})
    backwave_jobs.assert_enqueued("project.demo.tasks.failing_job")

    assert backwave_pump.drain().retried == 3
    backwave_pump.advance(0.5)  # first backoff: 0.25 to 0.5 s
    assert backwave_pump.drain().retried == 3
    backwave_pump.advance(1.0)  # second: 0.5 to 1 s
    drained = backwave_pump.drain()

    assert drained.failed == 3
    assert set(Job.objects.values_list("state", "attempts")) == {("failed", 3)}
    assert Attempt.objects.filter(state="failed").count() == 9
    page = client.get(response.url)
    assert page.status_code == 200
    assert (
        '<div class="count" id="count-failed"><span class="state state-failed">Failed</span><b>3</b></div>'
        in page.content.decode()
    )

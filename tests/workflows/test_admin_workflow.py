"""The admin's job page for workflows: ancestors and dependents (links, states), the Job Output,
and why a waiting or held job waits."""

from __future__ import annotations

import pytest
from django.urls import reverse

from backwave.models import Job
from backwave.tasking.workflow import Dependency, Workflow
from backwave.testing import DeterministicPump

from . import tasks

pytestmark = pytest.mark.django_db


def page(client, job_id) -> str:
    response = client.get(reverse("admin:backwave_job_change", args=[job_id]))
    assert response.status_code == 200
    return response.content.decode()


def test_a_waiting_job_shows_what_it_waits_for_and_links_both_ways(admin_client):
    flow = Workflow()
    a = flow.add(tasks.source, ["a", 1])
    b = flow.add(tasks.source, ["b", 2])
    flow.add(tasks.combine, ["c"], after=[a, Dependency(b, on_failure="hold")])
    first, second, third = flow.enqueue()
    with DeterministicPump(tasks=[tasks]) as pump:
        Job.objects.filter(pk=second.id).update(run_at="2999-01-01T00:00:00Z")  # b not due yet
        pump.drain()

    html = page(admin_client, third.id)
    assert 'id="job-waits"' in html
    assert "Waiting for 1 of its 2 ancestors to succeed:" in html
    assert f'<a href="/admin/backwave/job/{second.id}/change/">#{second.id}</a> (ready)' in html
    assert 'id="job-ancestors"' in html and f">#{first.id}</a>" in html and "hold this job" in html

    ancestor_page = page(admin_client, first.id)
    assert 'id="job-dependents"' in ancestor_page and f">#{third.id}</a>" in ancestor_page
    assert "&quot;value&quot;: 1" in ancestor_page  # its Job Output


def test_a_held_job_says_why_and_what_the_operator_can_do(admin_client):
    flow = Workflow()
    bad = flow.add(tasks.fails)
    flow.add(tasks.noop, after=[Dependency(bad, on_failure="hold")])
    bad_result, held = flow.enqueue()
    with DeterministicPump(tasks=[tasks]) as pump:
        pump.drain()

    html = page(admin_client, held.id)
    assert f"Held: ancestor #{bad_result.id} failed. Retry it to re-arm this job" in html
    assert "Held for an operator" in html

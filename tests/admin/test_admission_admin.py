"""The admin shows admission: a queue's per-key and rate limits, a job's keys."""

from __future__ import annotations

import pytest
from django.urls import reverse

from backwave.models import Job, Queue
from tests.backend import sample_tasks

from .test_queues_admin import QUEUES, QUEUES_PAGE_QUERIES, lines_by_name

pytestmark = pytest.mark.django_db


def test_the_queues_page_shows_per_key_and_rate_limits_in_the_same_queries(admin_client, django_assert_num_queries):
    Queue.objects.create(name="api", key_concurrency_limit=2, rate_limit=50, key_rate_limit=5, rate_period=1.0)
    with django_assert_num_queries(QUEUES_PAGE_QUERIES):
        response = admin_client.get(QUEUES)
    line = lines_by_name(response)["api"]
    assert (line.key_concurrency_limit, line.rate_shown) == (2, "50 / 1 s, 5 / 1 s per key")
    html = response.content.decode()
    assert '<td class="num key-limit">2</td>' in html
    assert '<td class="num rate-limit">50 / 1 s, 5 / 1 s per key</td>' in html


def test_a_jobs_page_shows_its_uniqueness_and_limit_keys(admin_client):
    unique = sample_tasks.sync_order.enqueue(7)
    keyed = sample_tasks.call_api.enqueue("acme")
    page = admin_client.get(reverse("admin:backwave_job_change", args=[unique.id])).content.decode()
    assert "tests.backend.sample_tasks.sync_order:{&quot;order_id&quot;:7}" in page
    assert "ready, running" in page
    page = admin_client.get(reverse("admin:backwave_job_change", args=[keyed.id])).content.decode()
    assert "acme" in page
    Job.objects.filter(pk=unique.id).update(state="cancelled")
    page = admin_client.get(reverse("admin:backwave_job_change", args=[unique.id])).content.decode()
    assert "released (left the covered states)" in page

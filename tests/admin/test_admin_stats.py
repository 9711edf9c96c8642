"""The admin's bounded counts and planner estimates."""

from __future__ import annotations

import pytest
from django.db import connection

from backwave.ops import stats as admin_stats
from backwave.models import Job

from .conftest import make_job

pytestmark = pytest.mark.django_db


def test_estimates_follow_the_planners_independence_assumption():
    stats = admin_stats.TableStatistics(
        rows=1000,
        columns={"state": (0.0, 3, {"succeeded": 0.9, "failed": 0.08}), "queue": (0.0, 4, {"default": 0.5, "emails": 0.3})},
    )
    assert stats.estimate(state="failed", queue="emails") == 24
    assert stats.estimate(state="cancelled") == 20  # the rest (2%) over the one value not listed
    assert stats.estimate(queue="reports") == 100  # the rest (20%) over the two values not listed
    assert admin_stats.TableStatistics(rows=None).estimate(state="failed") is None


def test_statistics_read_from_the_server():
    for _ in range(4):
        make_job(queue="emails", state="failed")
    make_job(queue="default")
    make_job(queue="default")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backwave_job")
    stats = admin_stats.table_statistics()
    assert stats.rows == 6
    assert stats.common_values("queue") == ["default", "emails"]
    assert stats.estimate(state="failed", queue="emails") == 3  # 6 x 4/6 x 4/6: an estimate, not 4


def test_paginator_counts_exactly_up_to_the_cap():
    for _ in range(3):
        make_job()
    paginator = admin_stats.EstimatedCountPaginator(Job.objects.order_by("-id"), 2)
    paginator.cap = 3
    assert (paginator.count, paginator.estimated) == (3, False)
    assert paginator.num_pages == 2


def test_paginator_past_the_cap_uses_the_planner(django_assert_num_queries):
    for _ in range(6):
        make_job()
    paginator = admin_stats.EstimatedCountPaginator(Job.objects.order_by("-id"), 2)
    paginator.cap = 3
    with django_assert_num_queries(2):  # the bounded count, then one EXPLAIN
        assert paginator.count >= 4
    assert paginator.estimated


@pytest.mark.parametrize(("number", "shown"), [(None, "?"), (999, "999"), (12_345, "12k"), (1_234_567, "1.2M")])
def test_humanized_estimates(number, shown):
    assert admin_stats.humanize_estimate(number) == shown


def test_sparkline_points_fill_the_box():
    points = admin_stats.sparkline_points([0, 5, 10], 100, 20, pad=0)
    assert points == "0.0,20.0 50.0,10.0 100.0,0.0"
    assert admin_stats.sparkline_points([0, 0], 10, 10, pad=0) == "0.0,10.0 10.0,10.0"

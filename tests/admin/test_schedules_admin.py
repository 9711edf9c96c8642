"""The Schedules page: expression, next run, last minted slot, enabled; enable and disable."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from backwave.models import Schedule

from .conftest import make_schedule

pytestmark = pytest.mark.django_db

SCHEDULES = reverse("admin:backwave_schedule_changelist")
# Session, user, the bounded count, the page of schedules, the queue filter's choices, the banner.
SCHEDULES_PAGE_QUERIES = 6


def test_schedules_list_their_expression_next_run_and_last_slot(admin_client):
    make_schedule(
        "nightly", cron="0 3 * * *", next_run=datetime(2030, 1, 2, 3, tzinfo=UTC), last_slot=datetime(2030, 1, 1, 3, tzinfo=UTC)
    )
    content = admin_client.get(SCHEDULES).content.decode()
    for text in (
        "nightly",
        "0 3 * * *",
        "project.demo.tasks.fast_job",
        # the Jobs page's format, the full time and zone on hover (never "Jan. 2, 2030, 3 a.m.")
        'title="2030-01-02 03:00:00 UTC">01-02 03:00:00</time>',
        'title="2030-01-01 03:00:00 UTC">01-01 03:00:00</time>',
    ):
        assert text in content
    assert "lasts until a worker next starts" in content  # the sync at worker start rewrites enabled


def test_disable_then_enable(operator_client):
    nightly = make_schedule("nightly", next_run=datetime(2030, 1, 2, 3, tzinfo=UTC))
    make_schedule("hourly", cron="0 * * * *", enabled=False)

    response = operator_client.post(SCHEDULES, {"action": "disable", "_selected_action": [nightly.pk], "index": 0}, follow=True)
    assert "Disabled 1 schedule." in [str(m) for m in response.context["messages"]]
    nightly.refresh_from_db()
    assert (nightly.enabled, nightly.next_run) == (False, None)

    ids = list(Schedule.objects.values_list("pk", flat=True))
    response = operator_client.post(SCHEDULES, {"action": "enable", "_selected_action": ids, "index": 0}, follow=True)
    assert "Enabled 2 schedules." in [str(m) for m in response.context["messages"]]
    assert set(Schedule.objects.values_list("enabled", "next_run")) == {(True, None)}


@pytest.mark.parametrize("selected", ["²", "abc", "9" * 25])
def test_a_toggle_on_a_bad_id_says_so_and_changes_nothing(operator_client, selected):
    nightly = make_schedule("nightly")
    data = {"action": "disable", "_selected_action": [str(nightly.pk), selected], "index": 0}
    response = operator_client.post(SCHEDULES, data, follow=True)
    assert response.status_code == 200
    assert f"{selected!r} is not a schedule id; nothing was changed." in [str(m) for m in response.context["messages"]]
    assert Schedule.objects.get().enabled


def test_a_schedule_url_with_a_non_ascii_number_is_not_that_schedule(admin_client):
    nightly = make_schedule("nightly")
    url = reverse("admin:backwave_schedule_change", args=[str(nightly.pk).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))])
    response = admin_client.get(url, follow=True)
    assert [m for m in response.context["messages"] if "doesn’t exist" in str(m)]


def test_toggling_needs_its_permission(readonly_client):
    schedule = make_schedule("nightly")
    assert 'name="action"' not in readonly_client.get(SCHEDULES).content.decode()
    assert (
        readonly_client.post(SCHEDULES, {"action": "disable", "_selected_action": [schedule.pk], "index": 0}).status_code == 403
    )
    assert Schedule.objects.get().enabled


def test_schedules_page_queries_are_pinned(admin_client, django_assert_num_queries):
    for n in range(5):
        make_schedule(f"s{n}")
    with django_assert_num_queries(SCHEDULES_PAGE_QUERIES):
        assert admin_client.get(SCHEDULES).status_code == 200

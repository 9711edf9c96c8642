"""The Pumps page (halted first, stale flagged) and the halted-pump banner on every BackWave page."""

from __future__ import annotations

import pytest
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse

from .conftest import make_job, make_pump, make_schedule

pytestmark = pytest.mark.django_db

PUMPS = reverse("admin:backwave_pump_changelist")
# Session, user, the bounded count, the page of pumps, the group filter's choices, the banner.
PUMPS_PAGE_QUERIES = 6


def test_halted_pumps_come_first_then_degraded_then_healthy(admin_client):
    make_pump("a-healthy", "healthy", group="alpha")
    make_pump("b-degraded", "degraded", reason="OperationalError: connection refused", group="alpha")
    make_pump("c-halted", "halted", reason="DriverError: JobFinished in state draining", group="zulu")
    make_pump("d-healthy", "healthy", group="beta")

    response = admin_client.get(PUMPS)

    assert [pump.worker_id for pump in response.context["cl"].result_list] == ["c-halted", "b-degraded", "a-healthy", "d-healthy"]
    content = response.content.decode()
    assert "DriverError: JobFinished in state draining" in content
    for text in ("node-1", "4242", "alpha", "zulu"):
        assert text in content


def test_a_live_pump_past_its_lease_is_flagged_stale_a_halted_one_is_not(admin_client):
    make_pump("fresh", age=2, lease=30)
    make_pump("silent", age=120, lease=30)
    make_pump("stopped", "halted", reason="boom", age=600, lease=30)

    content = admin_client.get(PUMPS).content.decode()

    assert content.count("· stale") == 1
    assert "120 s ago · stale" in content
    assert "600 s ago" in content


def test_the_banner_shows_on_every_backwave_page_while_a_pump_is_halted(admin_client):
    job = make_job(state="failed")
    schedule = make_schedule("nightly")
    pump = make_pump("node-1:42:default:0:abc", "halted", reason="InvariantViolation: lease token mismatch")
    pages = [
        reverse("admin:app_list", args=["backwave"]),
        reverse("admin:backwave_queue_changelist"),
        reverse("admin:backwave_job_changelist"),
        reverse("admin:backwave_job_change", args=[job.pk]),
        reverse("admin:backwave_job_history", args=[job.pk]),
        PUMPS,
        reverse("admin:backwave_pump_change", args=[pump.pk]),
        reverse("admin:backwave_schedule_changelist"),
        reverse("admin:backwave_schedule_change", args=[schedule.pk]),
    ]
    for page in pages:
        content = admin_client.get(page).content.decode()
        assert 'id="backwave-halted-banner"' in content, page
        assert "InvariantViolation: lease token mismatch" in content, page
        assert "A pump is halted." in content, page


def test_no_banner_while_no_pump_is_halted(admin_client):
    make_pump("ok", "healthy")
    make_pump("wobbly", "degraded", reason="connection reset")
    for page in (PUMPS, reverse("admin:backwave_queue_changelist"), reverse("admin:backwave_job_changelist")):
        assert "backwave-halted-banner" not in admin_client.get(page).content.decode()


def test_the_banner_counts_many_halted_pumps(admin_client):
    for n in range(5):
        make_pump(f"p{n}", "halted", reason=f"reason {n}")
    content = admin_client.get(PUMPS).content.decode()
    assert "More than 3 pumps are halted." in content


def test_read_only_user_sees_pumps(readonly_client):
    make_pump("p", "halted", reason="why")
    response = readonly_client.get(PUMPS)
    assert response.status_code == 200
    assert 'name="action"' not in response.content.decode()


def test_pumps_page_queries_are_pinned(admin_client, django_assert_num_queries):
    for n in range(6):
        make_pump(f"p{n}", ("halted", "degraded", "healthy")[n % 3], reason="r")
    ContentType.objects.clear_cache()
    with django_assert_num_queries(PUMPS_PAGE_QUERIES):
        assert admin_client.get(PUMPS).status_code == 200

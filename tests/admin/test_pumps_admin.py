"""The Pumps page (halted, lost, stale, degraded, healthy; in flight counted live) and the
halted-pump banner on every BackWave page."""

from __future__ import annotations

import re

import pytest
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse

from tests.factories import make_lease

from .conftest import make_job, make_pump, make_schedule

pytestmark = pytest.mark.django_db

PUMPS = reverse("admin:backwave_pump_changelist")
# Session, user, the bounded count, the page of pumps, the group filter's choices, the banner,
# and the page's jobs in flight (one aggregate, however many pumps).
PUMPS_PAGE_QUERIES = 7


ROW = re.compile(
    r'<tr>.*?class="bw-badge bw-(?P<badge>[a-z]+)"[^>]*>(?P<status>[^<]+)</span>.*?'
    r'class="field-worker_id"><a [^>]*>(?P<worker_id>[^<]+)</a>.*?class="field-in_flight[a-z_]*">(?:<a [^>]*>)?(?P<in_flight>[^<]*)(?:</a>)?</td>.*?</tr>',
    re.S,
)


def rows(response) -> list[dict[str, str]]:
    """The rendered rows in the page's order: worker_id, status (as shown), badge, in_flight."""
    return [match.groupdict() for match in ROW.finditer(response.content.decode().split("<tbody>", 1)[1])]


def shown(response) -> list[tuple[str, str]]:
    """(worker id, status shown) per row, in the page's order."""
    return [(row["worker_id"], row["status"]) for row in rows(response)]


def run_under(worker_id: str, count: int, *, lease_expires_in: float = 30.0) -> None:
    """``count`` running jobs under a lease of ``worker_id``."""
    lease = make_lease(worker_id, lease_expires_in)
    for _ in range(count):
        make_job(state="running", lease_id=lease.id, worker_id=worker_id)


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


def test_a_pump_without_a_live_lease_is_lost_red_and_first_after_the_halted_ones(admin_client):
    make_pump("a-healthy", "healthy")
    make_pump("b-killed", "healthy", lease_expires_in=-1)  # kill -9: its row still says healthy
    make_pump("c-expired", "degraded", reason="connection refused", lease_expires_in=None)  # maintenance expired its lease
    make_pump("d-silent", "healthy", age=120, lease=30)
    make_pump("e-degraded", "degraded", reason="connection reset")
    make_pump("f-halted", "halted", reason="InvariantViolation: boom", lease_expires_in=None)

    response = admin_client.get(PUMPS)

    assert shown(response) == [
        ("f-halted", "Halted"),
        ("b-killed", "Lost"),
        ("c-expired", "Lost"),
        ("d-silent", "Stale"),
        ("e-degraded", "Degraded"),
        ("a-healthy", "Healthy"),
    ]
    content = response.content.decode()
    assert content.count('class="bw-badge bw-lost"') == 2
    assert content.count(">Lost</span>") == 2
    assert "it last reported healthy" in content and "it last reported degraded" in content
    assert content.count(">Stale</span>") == 1
    assert ".bw-halted, .bw-lost {" in content, "lost is styled red, as halted is"


def test_a_lost_pump_is_lost_on_its_own_page_too(admin_client):
    make_pump("killed", "healthy", lease_expires_in=-1)
    content = admin_client.get(reverse("admin:backwave_pump_change", args=["killed"])).content.decode()
    assert ">Lost</span>" in content


def test_in_flight_is_counted_live_from_the_running_jobs_not_the_last_heartbeat(admin_client):
    make_pump("busy", in_flight=0)  # it last reported an idle moment
    run_under("busy", 16)
    make_pump("idle", in_flight=5)  # it last reported five; they have all finished since
    make_pump("killed", in_flight=0, lease_expires_in=None)
    run_under("killed", 2, lease_expires_in=-3)  # still held under its lapsed lease until maintenance
    make_job(state="ready")

    response = admin_client.get(PUMPS)

    assert [(row["worker_id"], row["in_flight"]) for row in rows(response)] == [("killed", "2"), ("busy", "16"), ("idle", "0")]
    page = admin_client.get(reverse("admin:backwave_pump_change", args=["busy"])).content.decode()
    assert re.search(
        r'<div class="readonly"><a href="[^"]*\?state=running&amp;worker=busy" class="bw-pump-jobs"[^>]*>16</a></div>', page
    )


def test_the_pumps_page_query_count_does_not_grow_with_pumps_or_their_jobs(admin_client, django_assert_num_queries):
    for n in range(20):
        make_pump(f"p{n:02}", ("halted", "degraded", "healthy")[n % 3], reason="r", lease_expires_in=(30, -1, None)[n % 3 // 2])
        run_under(f"p{n:02}", n % 4)
    ContentType.objects.clear_cache()
    with django_assert_num_queries(PUMPS_PAGE_QUERIES):
        response = admin_client.get(PUMPS)
    assert sum(int(row["in_flight"]) for row in rows(response)) == sum(n % 4 for n in range(20))

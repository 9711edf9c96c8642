"""The Django metrics view (``backwave.urls``): who may read it, what it says, and what it costs,
parsed with prometheus_client's own parser, against the real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now
from prometheus_client.parser import text_string_to_metric_families

from backwave.ops import metrics
from backwave.models import Pump
from tests.admin.conftest import make_job, staff_user
from tests.factories import JobFactory, make_lease

URL = "/backwave/metrics"
TOKEN = "t0ken-for-the-metrics-tests-0123456789"
BOTH = pytest.mark.django_db(databases=["default", "other"])
# Autocommit, as a request runs: inside a test's transaction the view's atomic() would add a
# savepoint pair to every count.
BOTH_COMMITTED = pytest.mark.django_db(databases=["default", "other"], transaction=True)


@pytest.fixture
def token(settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "METRICS_TOKEN": TOKEN}
    return TOKEN


def samples_of(response) -> dict:
    """{sample name: {labels tuple: value}} of a scrape, through prometheus_client's parser."""
    assert response.status_code == 200, response.content
    samples: dict[str, dict] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples[name][tuple(sorted(labels.items()))]


def scrape(client, token=TOKEN, **headers):
    return client.get(URL, headers={"Authorization": f"Bearer {token}", **headers})


@BOTH
def test_jobs_by_queue_and_state_latency_pumps_and_lapsed_leases(client, token):
    make_job(queue="emails")
    make_job(queue="emails", run_at=Now() - timedelta(seconds=120), priority=-5)  # the oldest, at a low priority
    make_job(queue="emails", run_at=Now() - timedelta(seconds=30), priority=50)
    make_job(queue="emails", run_at=Now() + timedelta(hours=1))  # scheduled: not due, not waiting
    make_job(queue="reports", run_at=Now() + timedelta(hours=1))  # only scheduled jobs: age 0
    make_job(queue="emails", state="running")
    make_job(queue="emails", state="failed")
    make_job(queue="default", state="quarantined")
    Pump.objects.create(worker_id="a:1:default:0", group="default", hostname="a", pid=1, status="healthy", lease_duration=30)
    make_lease("a:1:default:0", 30)
    Pump.objects.create(worker_id="b:2:default:0", group="default", hostname="b", pid=2, status="healthy", lease_duration=30)
    dead = make_lease("b:2:default:0", -5)  # killed: its row still says healthy, its lease lapsed
    JobFactory(queue="emails", state="running", lease_id=dead.id, attempts=1)
    Pump.objects.create(
        worker_id="c:3:reports:0", group="reports", hostname="c", pid=3, status="halted", reason="boom", lease_duration=30
    )

    response = scrape(client)
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]
    samples = samples_of(response)
    emails = {"database": "default", "queue": "emails"}
    assert value(samples, "backwave_jobs", **emails, state="ready") == 3
    assert value(samples, "backwave_jobs", **emails, state="scheduled") == 1
    assert value(samples, "backwave_jobs", **emails, state="running") == 2
    assert value(samples, "backwave_jobs", **emails, state="failed") == 1
    assert value(samples, "backwave_jobs", **emails, state="quarantined") == 0
    assert value(samples, "backwave_jobs", database="default", queue="default", state="quarantined") == 1
    assert 119 <= value(samples, "backwave_queue_oldest_job_age_seconds", **emails) < 180
    assert value(samples, "backwave_queue_oldest_job_age_seconds", database="default", queue="reports") == 0
    assert value(samples, "backwave_queue_paused", **emails) == 0

    default_group = {"database": "default", "group": "default"}
    assert value(samples, "backwave_pumps", **default_group, status="healthy") == 1
    assert value(samples, "backwave_pumps", **default_group, status="lost") == 1
    assert value(samples, "backwave_pumps", **default_group, status="halted") == 0
    assert value(samples, "backwave_pumps", database="default", group="reports", status="halted") == 1
    assert value(samples, "backwave_leases_lapsed", database="default") == 1
    assert value(samples, "backwave_jobs_under_lapsed_leases", database="default") == 1
    # The other database, where the "remote" backend enqueues, is reported too.
    assert value(samples, "backwave_leases_lapsed", database="other") == 0


@BOTH_COMMITTED
def test_the_scrape_costs_six_statements_per_database(client, token, django_assert_num_queries):
    for queue in ("a", "b", "c"):
        for priority in (-1, 0, 1):
            make_job(queue=queue, priority=priority, run_at=Now() - timedelta(seconds=5))
    # BEGIN, JIT off, queues (depths and latency), COMMIT, pumps, lapsed leases: on each database
    # BackWave's backends enqueue into.
    with django_assert_num_queries(6), django_assert_num_queries(6, connection=connections["other"]) as other:
        samples_of(scrape(client))
    statements = [query["sql"].split(None, 1)[0] for query in other.captured_queries]
    assert statements == ["BEGIN", "SELECT", "WITH", "COMMIT", "SELECT", "SELECT"], statements
    assert other.captured_queries[1]["sql"] == "SELECT set_config('jit', 'off', true)"


@BOTH_COMMITTED
def test_a_depth_past_the_cap_reports_the_planners_estimate(client, token, monkeypatch, django_assert_num_queries):
    monkeypatch.setattr(metrics, "COUNT_CAP", 3)
    JobFactory.create_batch(10, queue="big")
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE backwave_job")
    with django_assert_num_queries(7):  # one more where a depth passed the cap: the planner's statistics
        samples = samples_of(scrape(client))
    assert value(samples, "backwave_jobs", database="default", queue="big", state="ready") == 10  # counted 4, estimated 10
    assert value(samples, "backwave_jobs", database="default", queue="big", state="scheduled") == 0


@BOTH
def test_the_queue_query_walks_the_claim_index_not_the_backlog():
    from django.db import connection

    from backwave.store.queries import QUERIES

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table: make the planner show its index path
        cursor.execute("EXPLAIN " + QUERIES["metrics_queues"], {"names": ["a"], "limit": 10_001})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "backwave_job_claim" in plan and "Seq Scan on backwave_job" not in plan, plan


@BOTH
def test_openmetrics_when_the_scraper_asks_for_it(client, token):
    response = client.get(
        URL, headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


@BOTH
def test_no_credentials_is_a_401_that_asks_for_a_bearer_token(client, token, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="backwave"'


@BOTH
@pytest.mark.parametrize("header", [f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN])
def test_a_wrong_token_is_refused_without_a_query(client, token, header, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get(URL, headers={"Authorization": header})
    assert response.status_code == 401
    assert "error=" in response["WWW-Authenticate"]


@BOTH
def test_without_a_configured_token_no_bearer_is_accepted(client):
    response = scrape(client, token="")
    assert response.status_code == 401
    assert scrape(client, token="None").status_code == 401


@BOTH
def test_staff_with_the_view_permission_may_read_it_in_a_browser(client):
    client.force_login(staff_user("viewer", ["view_job"]))
    samples = samples_of(client.get(URL))
    assert value(samples, "backwave_leases_lapsed", database="default") == 0


@BOTH
def test_staff_without_the_permission_and_users_without_staff_are_refused(client):
    client.force_login(staff_user("nobody", []))
    assert client.get(URL).status_code == 403
    user = staff_user("not-staff", ["view_job"])
    user.is_staff = False
    user.save()
    client.force_login(user)
    assert client.get(URL).status_code == 403


@BOTH
def test_only_get(client, token):
    assert client.post(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405


def test_a_short_or_non_string_token_is_refused_by_the_settings_check_without_showing_it(settings):
    from backwave.conf import settings_problems

    settings.BACKWAVE = {"METRICS_TOKEN": "short-secret"}
    (problem,) = settings_problems()
    assert "METRICS_TOKEN" in problem and "at least 24" in problem and "(12 characters)" in problem
    assert "short-secret" not in problem
    settings.BACKWAVE = {"METRICS_TOKEN": 12345}
    assert "got int" in settings_problems()[0]
    settings.BACKWAVE = {"METRICS_TOKEN": TOKEN}
    assert settings_problems() == []

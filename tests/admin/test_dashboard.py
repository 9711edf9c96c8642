"""The dashboard at the top of the BackWave admin, and the Task statistics page: what they say
about health, stuck jobs and failures, from which rows, in how many queries."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db.models import F
from django.db.models.functions import Now
from django.urls import reverse

from backwave.admin import dashboard
from backwave.models import Attempt, Job, Pump, TaskStat
from backwave.testing.store import DjangoConnectionStore
from tests.factories import make_lease

from .conftest import make_attempt, make_job, make_pump

pytestmark = pytest.mark.django_db

INDEX = reverse("admin:app_list", kwargs={"app_label": "backwave"})
STATS = reverse("admin:backwave_taskstat_changelist")
# Session and user; the halted banner; the pumps; the planner's statistics, the unserved queues and
# the queue lines (as the Queues page); hint sessions; rollup status; the chart's series; the queues' latency; the
# running jobs; their tasks' usual durations; the recent failures. And JIT off: set, then put
# back, inside a savepoint (SAVEPOINT and RELEASE counted): the test's transaction encloses the
# page. In autocommit it is BEGIN and the setting (see the autocommit test below).
DASHBOARD_QUERIES = 18
# Session, user, the banner, the per-task sums, the rollup status.
STATS_QUERIES = 5
SLOW = "app.tasks.slow"


def roll_up():
    store = DjangoConnectionStore()
    return sum(store.roll_up_task_stats(limit=10_000, settle=0) for _ in range(3))


def finished(task_path: str, state: str, seconds: float, *, number: int = 1, **job_fields) -> Job:
    """A job finished just now after an attempt of ``seconds``."""
    job = make_job(task_path=task_path, state=state, attempts=number, **job_fields)
    attempt_state = {"succeeded": "succeeded", "quarantined": "quarantined"}.get(state, "failed")
    attempt = make_attempt(job, number, attempt_state)
    Attempt.objects.filter(pk=attempt.pk).update(started_at=F("finished_at") - timedelta(seconds=seconds))
    return job


def page(client, url=INDEX, **params) -> str:
    response = client.get(url, params)
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, element_id: str) -> str:
    """The element with that id, to its closing tag (none of them nests its own kind)."""
    match = re.search(rf'<(\w+)[^>]*\bid="{element_id}".*?</\1>', html, re.S)
    assert match, f"no #{element_id} on the page"
    return match.group(0)


def test_a_healthy_cluster_says_so_in_one_sentence(admin_client):
    make_pump("node-1:4242:default:0:aa")
    html = page(admin_client)
    verdict = section(html, "bw-verdict")
    assert "Degraded." in verdict and "but 0 hint listeners" in verdict  # the test's pump has no listener session
    assert "data-bw-live-region" in html and 'data-bw-live="5"' in html


def test_halted_and_lost_pumps_come_first_with_their_reason(admin_client):
    make_pump("a-ok")
    make_pump("b-halted", "halted", reason="InvalidEvent: ClaimReturned cannot be accepted in state NEW", lease_expires_in=None)
    make_pump("c-killed", lease_expires_in=-5)
    html = page(admin_client)
    assert "1 pump halted." in section(html, "bw-verdict")
    pumps = section(html, "bw-card-pumps")
    assert re.search(r'data-status="halted">1 halted', pumps) and re.search(r'data-status="lost">1 lost', pumps)
    assert "InvalidEvent: ClaimReturned" in pumps and "c-killed" in pumps and "a-ok" not in pumps


def test_a_queue_with_due_jobs_that_no_live_pump_serves_is_degraded_and_says_why(admin_client):
    """The quick start's failure: a healthy pump on 'default', the job waiting on 'emails'."""
    make_pump("node-1:4242:default:0:aa", queues=("default",))
    make_pump("node-1:4242:mail:0:bb", "halted", reason="InvalidEvent", queues=("emails",), lease_expires_in=None)
    make_job(queue="default", run_at=Now() - timedelta(seconds=30))
    make_job(queue="emails", run_at=Now() - timedelta(seconds=22))
    make_job(queue="reports", run_at=Now() + timedelta(hours=1))  # not due: nothing waits yet
    html = page(admin_client)
    verdict = section(html, "bw-verdict")
    assert "1 pump halted." in verdict  # the worse verdict first
    Pump.objects.filter(status="halted").delete()
    verdict = section(page(admin_client), "bw-verdict")
    assert "Degraded." in verdict and re.search(r"due for 2\d s; no worker serves <code>emails</code>", verdict), verdict
    assert "reports" not in verdict and "default</a>" not in verdict
    row = section(page(admin_client), "bw-dash-queue-emails")
    assert "degraded" in row and "no worker serves `emails`" in row


def test_no_pump_at_all_means_nothing_runs(admin_client):
    assert "No pump is running." in section(page(admin_client), "bw-verdict")


def test_a_job_under_a_lapsed_lease_is_stuck(admin_client):
    lease = make_lease("node-1:1:default:0", -3)
    stuck = make_job(task_path=SLOW, state="running", lease_id=lease.id, worker_id=lease.worker_id, last_attempted_at=Now())
    fine = make_job(task_path=SLOW, state="running", lease_id=make_lease("node-1:2:default:0", 30).id, last_attempted_at=Now())
    table = section(page(admin_client), "bw-dash-stuck")
    assert f"#{stuck.pk}<" in table and "lease has lapsed" in table
    assert f"#{fine.pk}<" not in table


def test_a_job_running_far_past_its_tasks_usual_duration_is_stuck(admin_client):
    for _ in range(dashboard.USUAL_MIN_SAMPLES):
        finished(SLOW, "succeeded", 2.0)
    roll_up()
    lease = make_lease("node-1:1:default:0", 30)
    long_ago = make_job(task_path=SLOW, state="running", lease_id=lease.id)
    recent = make_job(task_path=SLOW, state="running", lease_id=lease.id)
    unknown = make_job(task_path="app.tasks.never_seen", state="running", lease_id=lease.id)
    Job.objects.filter(pk=long_ago.pk).update(last_attempted_at=Now() - timedelta(seconds=60))  # > 3 x p95 (about 2 s) and > 5 s
    Job.objects.filter(pk__in=[recent.pk, unknown.pk]).update(last_attempted_at=Now() - timedelta(seconds=4))
    table = section(page(admin_client), "bw-dash-stuck")
    assert f"#{long_ago.pk}<" in table and "longer than usual" in table
    assert f"#{recent.pk}<" not in table and f"#{unknown.pk}<" not in table


def test_recent_failures_show_the_error_message_newest_first(admin_client):
    old = finished("app.tasks.a", "failed", 0.1)
    new = finished("app.tasks.b", "quarantined", 0.1)
    finished("app.tasks.c", "succeeded", 0.1)
    table = section(page(admin_client), "bw-dash-failures")
    assert table.index(f"#{new.pk}<") < table.index(f"#{old.pk}<")
    assert "RuntimeError: boom #1" in table and "builtins.RuntimeError" in table
    assert "app.tasks.c" not in table


def test_queue_latency_is_the_oldest_due_job_across_priorities(admin_client):
    make_job(queue="mail", priority=10, run_at=Now() - timedelta(seconds=5))
    make_job(queue="mail", priority=-5, run_at=Now() - timedelta(minutes=30))  # behind in line, waiting longest
    make_job(queue="mail", priority=0, run_at=Now() + timedelta(hours=1))  # scheduled: not waiting
    make_job(queue="idle", priority=0, run_at=Now() + timedelta(hours=1))
    html = page(admin_client)
    mail = section(html, "bw-dash-queue-mail")
    assert re.search(r'class="num latency">30 min \d+ s<', mail), mail
    assert 'class="num latency"><span class="bw-muted">-' in section(html, "bw-dash-queue-idle")


def test_the_charts_count_rolled_up_and_not_yet_rolled_up_attempts(admin_client):
    finished("app.tasks.a", "succeeded", 0.2)
    finished("app.tasks.a", "failed", 0.2)
    assert roll_up() == 2
    finished("app.tasks.a", "succeeded", 0.2)  # past the watermark: read live
    html = page(admin_client)
    assert re.search(r"succeeded 2 ·.*did not 1", html, re.S)
    assert '<svg class="bw-chart" id="bw-chart-throughput"' in html
    assert "Finished attempts: 2 succeeded, 1 not succeeded (per minute)" in html
    hourly = page(admin_client, range="24h")
    assert "(per hour)" in hourly and "last 24 hours" in hourly


def test_the_dashboard_runs_a_fixed_number_of_queries(admin_client, django_assert_num_queries):
    def more():
        make_pump(f"p{Job.objects.count()}", "halted", reason="r", lease_expires_in=None)
        lease = make_lease(f"w{Job.objects.count()}", -1)
        make_job(task_path=SLOW, state="running", lease_id=lease.id, last_attempted_at=Now())
        finished("app.tasks.a", "failed", 0.3)
        finished("app.tasks.b", "succeeded", 0.3)
        make_job(queue=f"q{Job.objects.count()}")

    ContentType.objects.clear_cache()
    for rounds in (1, 4):
        for _ in range(rounds):
            more()
        roll_up()
        page(admin_client)  # warm caches (content types, the task registry)
        with django_assert_num_queries(DASHBOARD_QUERIES):
            page(admin_client)


def test_task_statistics_per_task_with_percentiles(admin_client):
    for seconds in (0.1, 0.2, 0.3, 0.4, 2.0):
        finished("app.tasks.a", "succeeded", seconds)
    finished("app.tasks.a", "failed", 1.0, number=2, max_attempts=2)
    finished("app.tasks.b", "quarantined", 0.0)
    roll_up()
    html = page(admin_client, STATS, range="1h")
    lines = re.findall(r'<tr class="task-line">(.*?)</tr>', html, re.S)
    assert len(lines) == 2 and "app.tasks.a" in lines[0]  # most attempts first
    a = lines[0]
    for cls, shown in [
        ("attempts", "6"),
        ("succeeded", "5"),
        ("failed", "1"),
        ("retried", "0"),
        ("reruns", "1"),
        ("max", "2.00 s"),
    ]:
        assert re.search(rf'class="num {cls}">{re.escape(shown)}<', a), (cls, a)
    assert re.search(r'class="num failure-rate bw-warn">17 %<', a)
    p50 = float(re.search(r'class="num p50">([\d.]+) ms<', a).group(1))
    assert 300 * 0.9 <= p50 <= 300 * 1.1  # 0.3 s, within a bin
    assert "app.tasks.b" in lines[1] and 'class="num quarantined">1<' in lines[1]


def test_task_statistics_can_sort_by_failure_rate(admin_client):
    finished("app.tasks.mostly_fine", "succeeded", 0.1)
    finished("app.tasks.mostly_fine", "succeeded", 0.1)
    finished("app.tasks.broken", "failed", 0.1)
    roll_up()
    html = page(admin_client, STATS, sort="failure")
    assert html.index("app.tasks.broken") < html.index("app.tasks.mostly_fine")


def test_task_statistics_page_runs_a_fixed_number_of_queries(admin_client, django_assert_num_queries):
    ContentType.objects.clear_cache()
    page(admin_client, STATS)
    for n in range(3):
        for task in range(n * 5):
            finished(f"app.tasks.t{task}", "succeeded", 0.1)
        roll_up()
        with django_assert_num_queries(STATS_QUERIES):
            page(admin_client, STATS, range="7d")
    assert TaskStat.objects.exists()


def test_a_read_only_user_sees_the_dashboard_and_the_statistics_with_their_view_permission(readonly_client, readonly_user):
    assert "bw-dashboard" in page(readonly_client)
    assert readonly_client.get(STATS).status_code == 403
    readonly_user.user_permissions.add(Permission.objects.get(content_type__app_label="backwave", codename="view_taskstat"))
    assert "task-stats" in page(readonly_client, STATS)


@pytest.mark.parametrize(
    ("url", "region"),
    [
        (INDEX, "bw-dashboard"),
        (reverse("admin:backwave_queue_changelist"), "bw-live-queues"),
        (reverse("admin:backwave_pump_changelist"), "bw-live-results"),
        (reverse("admin:backwave_job_changelist"), "bw-live-results"),
    ],
)
def test_the_live_pages_carry_the_switch_and_their_regions(admin_client, url, region, settings):
    html = page(admin_client, url)
    assert 'data-bw-live="5"' in html and "backwave/live.js" in html
    assert re.search(rf'id="{region}"[^>]*data-bw-live-region|data-bw-live-region[^>]*id="{region}"', html)
    settings.BACKWAVE = {"ADMIN_REFRESH_SECONDS": 0}
    assert "data-bw-live=" not in page(admin_client, url)


def test_schedules_do_not_refresh_themselves(admin_client):
    assert "data-bw-live=" not in page(admin_client, reverse("admin:backwave_schedule_changelist"))


def test_the_queue_and_dashboard_reads_run_without_jit_and_leave_the_session_alone():
    from django.db import connection

    from backwave.ops import stats

    def jit():
        with connection.cursor() as cursor:
            cursor.execute("SHOW jit")
            return cursor.fetchone()[0]

    before = jit()
    with stats.without_jit():
        assert jit() == "off"
    assert jit() == before


@pytest.mark.django_db(transaction=True)
def test_in_autocommit_the_dashboard_is_its_reads_and_one_setting(client, django_assert_num_queries):
    """As a deployment runs it (no enclosing transaction): the 14 reads, and JIT off for them in
    their own transaction (Django counts its BEGIN; COMMIT is not a query to it)."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    make_pump("p1")
    page(client)
    with django_assert_num_queries(14 + 2):
        page(client)

"""The Queues page: one line per queue, bounded depths, throughput, pause/resume/limit."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone

from backwave.ops import stats as admin_stats
from backwave.models import Job, Queue

from .conftest import make_job

pytestmark = pytest.mark.django_db

QUEUES = reverse("admin:backwave_queue_changelist")
# Session, user, planner statistics (+ Queue names), unserved queues, depths (+ Queue rows),
# throughput, banner;
# and JIT off for them, set and put back in a savepoint (the test's transaction encloses the page;
# in autocommit it is BEGIN and the setting: see stats.without_jit).
QUEUES_PAGE_QUERIES = 11


def lines_by_name(response) -> dict:
    return {line.name: line for line in response.context["lines"]}


def counts(line) -> dict:
    return {state: str(count) for state, count in line.counts.items()}


def test_one_line_per_queue_with_its_depths(admin_client):
    make_job(queue="emails")
    make_job(queue="emails")
    make_job(queue="emails", run_at=timezone.now() + timedelta(hours=1))
    make_job(queue="emails", state="running")
    make_job(queue="emails", state="failed")
    make_job(queue="emails", state="quarantined")
    make_job(queue="emails", state="succeeded")
    make_job(queue="emails", state="waiting", waiting_on=1)
    make_job(queue="emails", state="waiting", waiting_on=2)
    make_job(queue="emails", state="held")

    lines = lines_by_name(admin_client.get(QUEUES))

    assert counts(lines["emails"]) == {
        "ready": "2",
        "scheduled": "1",
        "running": "1",
        "failed": "1",
        "quarantined": "1",
        "waiting": "2",
        "held": "1",
    }
    assert counts(lines["reports"]) == {
        "ready": "0",
        "scheduled": "0",
        "running": "0",
        "failed": "0",
        "quarantined": "0",
        "waiting": "0",
        "held": "0",
    }


def test_a_queue_with_due_jobs_that_no_live_pump_serves_is_degraded_and_says_why(admin_client):
    from .conftest import make_pump

    make_pump("node-1:1:default:0:aa", queues=("default",))
    make_pump("node-1:2:mail:0:bb", queues=("emails",), lease_expires_in=-5)  # killed: its lease lapsed
    make_job(queue="default", run_at=Now() - timedelta(seconds=30))
    make_job(queue="emails", run_at=Now() - timedelta(seconds=22))
    make_job(queue="nightly", run_at=Now() - timedelta(seconds=600))  # no setting names it: it gets its line anyway
    Queue.objects.create(name="stopped", paused=True)
    make_job(queue="stopped", run_at=Now() - timedelta(seconds=60))  # paused on purpose: waits, not degraded
    html = admin_client.get(QUEUES).content.decode()
    notes = re.findall(r'<p class="bw-unserved" id="unserved-([\w.-]+)">(.*?)</p>', html, re.S)
    assert [name for name, _ in notes] == ["emails", "nightly"]
    assert "due for 22 s; no worker serves <code>emails</code>" in notes[0][1]
    assert "due for 10 min; no worker serves <code>nightly</code>" in notes[1][1]
    lines = lines_by_name(admin_client.get(QUEUES))
    assert lines["emails"].unserved.reason == "due for 22 s; no worker serves `emails`"
    assert lines["default"].unserved is None and lines["stopped"].unserved is None


def test_waiting_and_held_counts_link_to_those_jobs(admin_client):
    make_job(queue="emails", state="waiting", waiting_on=1)
    make_job(queue="emails", state="held")
    make_job(queue="emails", state="held")

    content = admin_client.get(QUEUES).content.decode()

    jobs = reverse("admin:backwave_job_changelist")
    line = content.split('id="queue-emails"')[1].split("</tr>")[0]
    assert f'<td class="num waiting"><a href="{jobs}?queue=emails&amp;state=waiting">1</a></td>' in line
    assert f'<td class="num held"><a href="{jobs}?queue=emails&amp;state=held">2</a></td>' in line
    assert ">Waiting</th>" in content and ">Held</th>" in content


def test_queues_come_from_settings_rows_and_jobs(admin_client):
    Queue.objects.create(name="only-a-row", paused=True, concurrency_limit=3)
    make_job(queue="only-ready")
    make_job(queue="only-running", state="running")
    make_job(queue="only-failed", state="failed")
    make_job(queue="only-waiting", state="waiting", waiting_on=1)
    make_job(queue="only-held", state="held")

    lines = lines_by_name(admin_client.get(QUEUES))

    assert {
        "default",
        "emails",
        "reports",
        "only-a-row",
        "only-ready",
        "only-running",
        "only-failed",
        "only-waiting",
        "only-held",
    } <= set(lines)
    assert (str(lines["only-waiting"].counts["waiting"]), str(lines["only-held"].counts["held"])) == ("1", "1")
    row = lines["only-a-row"]
    assert (row.paused, row.concurrency_limit, row.has_row) == (True, 3, True)
    assert (lines["only-ready"].paused, lines["only-ready"].concurrency_limit) == (False, None)


def test_depths_are_capped_not_counted_in_full(admin_client, monkeypatch):
    monkeypatch.setattr(admin_stats, "COUNT_CAP", 3)
    for _ in range(5):
        make_job(queue="big", state="failed")
        make_job(queue="big", state="waiting", waiting_on=1)
    make_job(queue="big")

    line = lines_by_name(admin_client.get(QUEUES))["big"]

    assert str(line.counts["failed"]) == "3+"
    assert line.counts["failed"].capped
    assert (str(line.counts["waiting"]), line.counts["waiting"].capped) == ("3+", True)
    assert str(line.counts["ready"]) == "1"
    assert "3+" in admin_client.get(QUEUES).content.decode()


def test_capped_counts_carry_the_planners_estimate(admin_client, monkeypatch):
    from django.db import connection

    monkeypatch.setattr(admin_stats, "COUNT_CAP", 3)
    for _ in range(6):
        make_job(queue="big", state="failed")
    for _ in range(4):
        make_job(queue="big", state="held")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backwave_job")

    line = lines_by_name(admin_client.get(QUEUES))["big"]

    assert line.counts["failed"].estimate == 6
    assert line.counts["held"].estimate == 4


def test_throughput_per_minute_over_the_last_hour(admin_client):
    for minutes_ago in (0, 0, 5, 59):
        job = make_job(queue="emails", state="succeeded")
        Job.objects.filter(pk=job.pk).update(finished_at=Now() - timedelta(minutes=minutes_ago, seconds=1))
    old = make_job(queue="emails", state="succeeded")
    Job.objects.filter(pk=old.pk).update(finished_at=Now() - timedelta(minutes=61))
    make_job(queue="emails", state="cancelled")  # an operator's cancel is not an outcome

    response = admin_client.get(QUEUES)
    line = lines_by_name(response)["emails"]

    assert len(line.per_minute) == 60
    assert line.per_minute[-1] == 2 and line.per_minute[-6] == 1 and line.per_minute[0] == 1
    assert line.finished_last_hour == 4
    content = response.content.decode()
    assert "<svg" in content and "<polyline" in content
    assert "4 in the last 60 min" in content
    assert "<script" not in content.split('id="content-main"')[1]


def test_a_busy_hour_is_drawn_for_the_minutes_it_could_read():
    for minutes_ago in (1, 2, 30, 40):
        job = make_job(queue="emails", state="succeeded")
        Job.objects.filter(pk=job.pk).update(finished_at=Now() - timedelta(minutes=minutes_ago, seconds=1))

    rate = admin_stats.throughput(cap=2)

    assert rate.covered_minutes == 2
    assert sum(rate.per_queue["emails"]) == 2


def test_pause_resume_and_limit_from_the_page(operator_client):
    make_job(queue="emails")

    response = operator_client.post(QUEUES, {"action": "pause", "_selected_action": ["emails", "reports"]}, follow=True)
    assert "Paused 2 queues: emails, reports." in [str(m) for m in response.context["messages"]]
    assert set(Queue.objects.filter(paused=True).values_list("name", flat=True)) == {"emails", "reports"}

    operator_client.post(QUEUES, {"action": "set_limit", "limit": "4", "_selected_action": ["emails"]})
    assert Queue.objects.get(name="emails").concurrency_limit == 4
    assert Queue.objects.get(name="emails").paused  # a limit leaves the pause alone

    operator_client.post(QUEUES, {"action": "resume", "_selected_action": ["emails"]})
    operator_client.post(QUEUES, {"action": "set_limit", "limit": "", "_selected_action": ["emails"]})
    emails = Queue.objects.get(name="emails")
    assert (emails.paused, emails.concurrency_limit) == (False, None)

    lines = lines_by_name(operator_client.get(QUEUES))
    assert lines["reports"].paused and not lines["emails"].paused


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"action": "set_limit", "limit": "0", "_selected_action": ["emails"]}, "Invalid concurrency limit"),
        ({"action": "set_limit", "limit": "-3", "_selected_action": ["emails"]}, "Invalid concurrency limit"),
        (
            {"action": "set_limit", "limit": "2147483648", "_selected_action": ["emails"]},
            "Invalid concurrency limit '2147483648': use a whole number from 1 to 2,147,483,647",
        ),
        ({"action": "set_limit", "limit": "9" * 40, "_selected_action": ["emails"]}, "Invalid concurrency limit"),
        ({"action": "set_limit", "limit": "²", "_selected_action": ["emails"]}, "Invalid concurrency limit '²'"),
        ({"action": "pause", "_selected_action": ["bad name!"]}, "Invalid queue name 'bad name!'"),
        ({"action": "pause"}, "Select one or more queues first."),
        ({"action": "nonsense", "_selected_action": ["emails"]}, "Choose an action."),
    ],
)
def test_bad_queue_actions_say_what_is_wrong_and_write_nothing(operator_client, data, message):
    response = operator_client.post(QUEUES, data, follow=True)
    assert any(message in str(m) for m in response.context["messages"])
    assert not Queue.objects.exists()


def test_read_only_user_sees_queues_but_cannot_act(readonly_client):
    response = readonly_client.get(QUEUES)
    assert response.status_code == 200
    assert 'name="action"' not in response.content.decode()
    assert readonly_client.post(QUEUES, {"action": "pause", "_selected_action": ["emails"]}).status_code == 403
    assert not Queue.objects.exists()


def test_pausing_and_limiting_are_separate_permissions(client):
    from .conftest import staff_user

    client.force_login(staff_user("pauser", ["view_queue", "pause_queue"]))
    content = client.get(QUEUES).content.decode()
    assert 'value="pause"' in content and 'value="set_limit"' not in content
    assert client.post(QUEUES, {"action": "set_limit", "limit": "2", "_selected_action": ["emails"]}).status_code == 403


def test_queues_page_queries_are_pinned(admin_client, django_assert_num_queries):
    for queue in ("default", "emails", "reports", "extra"):
        for state in ("ready", "running", "failed", "quarantined", "succeeded", "waiting", "held"):
            make_job(queue=queue, state=state)
    Queue.objects.create(name="emails", paused=True)
    with django_assert_num_queries(QUEUES_PAGE_QUERIES):
        assert admin_client.get(QUEUES).status_code == 200

"""Who sees what on the BackWave console: each part of the dashboard needs the view permission
of the page it summarises, and a bulk action's confirmation (which counts what a search
matches) needs view_job like the jobs list it comes from. Real users, real permissions."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from .conftest import make_attempt, make_job, make_pump, staff_user

pytestmark = pytest.mark.django_db

INDEX = reverse("admin:app_list", kwargs={"app_label": "backwave"})
CHANGELIST = reverse("admin:backwave_job_changelist")
CANCEL_ALL = reverse("admin:backwave_job_bulk", args=["cancel-all"])
TASK = "shop.tasks.charge_card"
MESSAGE = "card 4242 declined for customer 77"


@pytest.fixture
def cluster():
    failed = make_job(state="failed", task_path=TASK, queue="payments", attempts=1)
    make_attempt(
        failed,
        1,
        "failed",
        error_class="shop.errors.Declined",
        traceback=f'Traceback (most recent call last):\n  File "x.py", line 1\nshop.errors.Declined: {MESSAGE}\n',
    )
    make_pump("host:1:default:0", "halted", reason="invariant broken in pump-secret-reason", lease_expires_in=None)
    make_job(task_path=TASK, queue="payments", payload={"args": [], "kwargs": {"customer": 77}})


def index_for(client, *codenames: str) -> str:
    client.force_login(staff_user("u-" + "-".join(codenames), list(codenames)))
    response = client.get(INDEX)
    assert response.status_code == 200
    return response.content.decode()


def test_a_schedule_viewer_sees_no_job_pump_or_queue_on_the_app_index(client, cluster):
    html = index_for(client, "view_schedule")
    assert client.get(CHANGELIST).status_code == 403
    for shown in (TASK, MESSAGE, "pump-secret-reason", "payments", 'id="bw-dashboard"'):
        assert shown not in html, shown


def test_a_pump_viewer_sees_the_health_but_not_the_jobs(client, cluster):
    html = index_for(client, "view_pump")
    assert 'id="bw-card-pumps"' in html and "pump-secret-reason" in html
    for shown in (TASK, MESSAGE, 'id="bw-dash-failures"', 'id="bw-dash-queues"'):
        assert shown not in html, shown


def test_a_queue_viewer_sees_the_queues_but_not_the_jobs_or_pumps(client, cluster):
    html = index_for(client, "view_queue")
    assert 'id="bw-dash-queues"' in html and "payments" in html
    for shown in (TASK, MESSAGE, "pump-secret-reason", 'id="bw-card-pumps"'):
        assert shown not in html, shown


def test_a_job_viewer_sees_failures_and_stuck_jobs(client, cluster):
    html = index_for(client, "view_job")
    assert MESSAGE in html and TASK in html
    assert "pump-secret-reason" not in html


def test_the_halted_banner_needs_view_pump(client, cluster):
    client.force_login(staff_user("scheduler", ["view_schedule", "toggle_schedule"]))
    html = client.get(reverse("admin:backwave_schedule_changelist")).content.decode()
    assert "pump-secret-reason" not in html


def test_a_bulk_confirmation_without_view_job_is_refused(client, cluster):
    client.force_login(staff_user("canceller", ["cancel_job"]))
    assert client.get(CHANGELIST).status_code == 403
    response = client.get(CANCEL_ALL, {"q": "customer=77"})
    assert response.status_code == 403
    assert client.post(CANCEL_ALL + "?q=customer%3D77").status_code == 403


def test_a_bulk_confirmation_with_view_job_counts(client, cluster):
    client.force_login(staff_user("canceller", ["view_job", "cancel_job"]))
    response = client.get(CANCEL_ALL, {"q": "customer=77"})
    assert response.status_code == 200 and response.context["count"] == 1


def test_backwave_jobs_as_a_user_without_view_job_does_not_count_matches(cluster):
    staff_user("canceller", ["cancel_job"])
    with pytest.raises(CommandError, match="view_job"):
        call_command(
            "backwave_jobs", "cancel", "--search", "customer=77", "--dry-run", "--as-user", "canceller", stdout=io.StringIO()
        )

"""The demo pages: enqueue N jobs in one transaction, then watch their states."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from backwave.models import Attempt, Job, Pump, Queue
from project.demo import views
from project.demo.runs import ids_from_token, run_token

pytestmark = pytest.mark.django_db


def post_form(client, **data):
    return client.post(reverse("demo:home"), data)


def test_home_page_renders_the_form(client):
    response = client.get(reverse("demo:home"))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'name="count"' in content
    for kind in views.JOB_KINDS:
        assert f'value="{kind}"' in content


@pytest.mark.parametrize(
    ("kind", "task_path", "queue"),
    [
        ("fast", "project.demo.tasks.fast_job", "default"),
        ("slow", "project.demo.tasks.slow_job", "default"),
        ("failing", "project.demo.tasks.failing_job", "default"),
        ("emails", "project.demo.tasks.email_job", "emails"),
        ("reports", "project.demo.tasks.report_job", "reports"),
    ],
)
def test_posting_the_form_enqueues_exactly_n_jobs(client, kind, task_path, queue):
    response = post_form(client, count=7, kind=kind)

    assert response.status_code == 302
    jobs = list(Job.objects.order_by("id"))
    assert len(jobs) == 7
    assert {(job.task_path, job.queue, job.state) for job in jobs} == {(task_path, queue, "ready")}
    ids = [job.id for job in jobs]
    assert response.url == reverse("demo:run", kwargs={"token": run_token(ids)})
    assert ids_from_token(response.url.rstrip("/").rsplit("/", 1)[-1]) == ids


def test_failing_jobs_carry_their_retry_options(client):
    post_form(client, count=2, kind="failing")
    assert {(job.max_attempts, job.backoff_base) for job in Job.objects.all()} == {(3, 0.5)}


def test_each_fast_job_gets_its_own_argument(client):
    post_form(client, count=3, kind="fast")
    assert [job.payload["args"] for job in Job.objects.order_by("id")] == [[1], [2], [3]]


def test_a_thousand_jobs_fit_in_one_post(client):
    response = post_form(client, count=1000, kind="fast")
    assert response.status_code == 302
    assert Job.objects.count() == 1000
    # Ids of one enqueue are consecutive here, so the run's URL stays short.
    assert len(response.url) < 120


@pytest.mark.parametrize(
    "data",
    [
        {"count": 5, "kind": "nonsense"},
        {"count": 0, "kind": "fast"},
        {"count": 1001, "kind": "fast"},
        {"count": "many", "kind": "fast"},
        {},
    ],
)
def test_invalid_form_is_refused_and_writes_nothing(client, data):
    response = client.post(reverse("demo:home"), data)
    assert response.status_code == 400
    assert b"errorlist" in response.content
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_failure_midway_rolls_back_the_whole_batch(client, monkeypatch):
    enqueue_all = views.enqueue_all

    def half_then_fail(task, calls):
        enqueue_all(task, calls[: len(calls) // 2])
        assert Job.objects.count() == len(calls) // 2  # written, not yet committed
        raise RuntimeError("enqueue failed midway")

    monkeypatch.setattr(views, "enqueue_all", half_then_fail)
    with pytest.raises(RuntimeError, match="midway"):
        post_form(client, count=10, kind="fast")
    assert Job.objects.count() == 0


def test_results_page_counts_states_and_refreshes_until_finished(client):
    response = post_form(client, count=3, kind="fast")
    run_url = response.url
    first, second, third = Job.objects.order_by("id")
    Job.objects.filter(pk=first.pk).update(state="succeeded", attempts=1, finished_at=timezone.now(), return_value=2)

    page = client.get(run_url)
    assert page.status_code == 200
    content = page.content.decode()
    assert 'http-equiv="refresh"' in content
    assert dict((value, count) for value, _label, count in page.context["states"]) == {
        "waiting": 0,
        "held": 0,
        "ready": 2,
        "running": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "quarantined": 0,
    }
    for job in (first, second, third):
        assert f'href="/admin/backwave/job/{job.pk}/change/"' in content

    Job.objects.update(state="succeeded", attempts=1, finished_at=timezone.now())
    page = client.get(run_url)
    content = page.content.decode()
    assert 'http-equiv="refresh"' not in content
    assert "All finished" in content


def test_results_page_marks_a_pending_retry(client):
    run_url = post_form(client, count=1, kind="failing").url
    Job.objects.update(attempts=1)  # failed once, ready again after its backoff
    assert "retry pending" in client.get(run_url).content.decode()


@pytest.mark.parametrize("token", ["1-3", "1-3:forged", "garbage"])
def test_results_page_refuses_unsigned_runs(client, token):
    assert client.get(reverse("demo:run", kwargs={"token": token})).status_code == 404


def healthy_pump(**fields):
    return Pump.objects.create(
        worker_id=fields.pop("worker_id", "host:1:default:0:abc"),
        group="default",
        hostname="host",
        pid=1,
        status=fields.pop("status", "healthy"),
        lease_duration=30,
        **fields,
    )


def test_results_page_says_when_no_worker_runs(client):
    run_url = post_form(client, count=2, kind="fast").url
    content = client.get(run_url).content.decode()
    assert "No worker is running" in content

    healthy_pump()
    assert "No worker is running" not in client.get(run_url).content.decode()


def test_a_halted_or_silent_pump_is_no_live_worker(client):
    run_url = post_form(client, count=1, kind="fast").url
    healthy_pump(worker_id="a", status="halted")
    healthy_pump(worker_id="b", last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert "No worker is running" in client.get(run_url).content.decode()


def test_results_page_says_which_queue_is_paused(client):
    healthy_pump()
    run_url = post_form(client, count=3, kind="emails").url
    Queue.objects.create(name="emails", paused=True)
    content = client.get(run_url).content.decode()
    assert "The queue <code>emails</code> is paused" in content
    assert "3 jobs wait" in content

    Queue.objects.filter(name="emails").update(paused=False)
    assert "is paused" not in client.get(run_url).content.decode()


def test_failed_rows_show_their_last_error(client):
    run_url = post_form(client, count=1, kind="failing").url
    job = Job.objects.get()
    Job.objects.update(state="failed", attempts=2, finished_at=timezone.now())
    for number in (1, 2):
        Attempt.objects.create(
            job=job,
            number=number,
            state="failed",
            worker_id="w",
            error_class="builtins.RuntimeError",
            traceback=f'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: demo failure, attempt {number}\n',
        )
    content = client.get(run_url).content.decode()
    assert "<th>Error</th>" in content
    assert "RuntimeError: demo failure, attempt 2" in content
    assert "attempt 1" not in content


def test_return_values_are_shown_as_json(client):
    run_url = post_form(client, count=2, kind="reports").url
    first, second = Job.objects.order_by("id")
    Job.objects.filter(pk=first.pk).update(state="succeeded", return_value={"rows": [42, True, None]})
    Job.objects.filter(pk=second.pk).update(state="succeeded", return_value="sent")
    content = client.get(run_url).content.decode()
    assert "<code>{&quot;rows&quot;: [42, true, null]}</code>" in content
    assert "<code>&quot;sent&quot;</code>" in content


def test_large_numbers_are_grouped(client):
    run_url = post_form(client, count=1000, kind="fast").url
    content = client.get(run_url).content.decode()
    assert "Run of 1,000 jobs" in content
    assert "<b>1,000</b>" in content  # the ready count
    assert "Run of 1000" not in content and "<b>1000</b>" not in content


def test_favicon_is_served_and_linked(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
    assert b"".join(response.streaming_content)[:4] == b"\x00\x00\x01\x00"  # an ICO header
    assert '<link rel="icon" href="/favicon.ico"' in client.get(reverse("demo:home")).content.decode()

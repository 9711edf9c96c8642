"""The Jobs list as an operator's console: argument and tag search, the worker, timing and error
columns, pumps and jobs linked both ways, retry/cancel all matching in batches, the admin's
history, the job page's attempts, redaction and the time zone."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from backwave.ops import actions as operations
from backwave.models import Attempt, Job

from .conftest import make_attempt, make_job, make_pump, staff_user

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:backwave_job_changelist")
RETRY_ALL = reverse("admin:backwave_job_bulk", args=["retry-all"])
CANCEL_ALL = reverse("admin:backwave_job_bulk", args=["cancel-all"])


def listed(client, **params) -> list[int]:
    return [job.pk for job in client.get(CHANGELIST, params).context["cl"].result_list]


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def change_url(job):
    return reverse("admin:backwave_job_change", args=[job.pk])


def kw(**kwargs):
    return {"args": [], "kwargs": kwargs}


# --- search by argument value and tag ------------------------------------------------------------


def test_search_finds_jobs_by_keyword_argument_value(admin_client):
    order_7 = make_job(payload=kw(order_id=7, customer={"email": "ann@example.com", "tier": "gold"}))
    order_8 = make_job(payload=kw(order_id=8, customer={"email": "bob@example.com"}))
    text_7 = make_job(payload=kw(order_id="7"))

    assert listed(admin_client, q="order_id=7") == [order_7.pk]  # the number
    assert listed(admin_client, q='order_id="7"') == [text_7.pk]  # quoted JSON: the text
    assert listed(admin_client, q="order_id='7'") == [text_7.pk]  # single quotes: the text too
    assert listed(admin_client, q="customer.email=bob@example.com") == [order_8.pk]
    assert listed(admin_client, q="customer.tier=gold order_id=7") == [order_7.pk]
    assert listed(admin_client, q='customer={"tier": "gold"}') == [order_7.pk]
    assert listed(admin_client, q="order_id=9") == []


def test_search_by_positional_argument_tag_and_task_together(admin_client):
    first = make_job(payload={"args": ["invoice-17", 3], "kwargs": {}}, tags=["tenant:7", "vip"], task_path="shop.tasks.send")
    make_job(payload={"args": ["invoice-17"], "kwargs": {}}, tags=["tenant:8"], task_path="shop.tasks.send")
    make_job(payload={"args": ["invoice-17"], "kwargs": {}}, tags=["tenant:7"], task_path="shop.tasks.refund")

    assert listed(admin_client, q="arg:invoice-17 tag:tenant:7 send") == [first.pk]
    assert listed(admin_client, q="arg:3") == [first.pk]
    assert listed(admin_client, q="tag:vip") == [first.pk]
    assert listed(admin_client, tag="vip") == [first.pk]
    assert sorted(listed(admin_client, q="tag:tenant:7")) == sorted(j.pk for j in Job.objects.filter(tags__contains=["tenant:7"]))


def test_a_value_with_spaces_is_quoted_and_a_bad_quote_is_explained(admin_client):
    job = make_job(payload=kw(subject="Your order has shipped"))
    assert listed(admin_client, q='subject="Your order has shipped"') == [job.pk]  # a JSON string
    assert listed(admin_client, q="subject='Your order has shipped'") == [job.pk]  # plain text
    assert listed(admin_client, q="subject=Your order") == []  # two terms: subject=Your, and a task path
    response = admin_client.get(CHANGELIST, {"q": 'subject="unbalanced'})
    assert response.status_code == 200
    assert [m for m in messages_of(response) if "unbalanced quote" in m]
    assert list(response.context["cl"].result_list) == []


def test_a_redacted_key_cannot_be_searched_for(admin_client):
    make_job(payload=kw(api_key="sk-live-123", user={"password": "hunter2"}))
    for term in ("api_key=sk-live-123", "user.password=hunter2", 'user={"password": "hunter2"}', 'arg:{"Authorization": "x"}'):
        response = admin_client.get(CHANGELIST, {"q": term})
        assert list(response.context["cl"].result_list) == [], term
        assert [m for m in messages_of(response) if "is redacted" in m and "cannot be searched" in m], term


def test_the_tag_filter_offers_the_planners_most_common_tags(admin_client):
    from django.db import connection

    for n in range(30):
        make_job(tags=["tenant:7"] if n % 2 else ["tenant:8", "vip"])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backwave_job")
    content = admin_client.get(CHANGELIST).content.decode()
    for tag in ("tenant:7", "tenant:8", "vip"):
        assert f"?tag={tag.replace(':', '%3A')}" in content


# --- columns and links ---------------------------------------------------------------------------


def test_the_list_shows_worker_started_duration_and_last_error(admin_client):
    failed = make_job(state="failed", attempts=1, worker_id="node-1:7:default:0")
    make_attempt(
        failed,
        1,
        "failed",
        error_class="shop.errors.PaymentDeclined",
        traceback='Traceback (most recent call last):\n  File "/app/shop/tasks.py", line 9, in charge\n    raise PaymentDeclined(code)\n'
        "shop.errors.PaymentDeclined: card declined (code 51)\n",
    )
    Job.objects.filter(pk=failed.pk).update(last_attempted_at=F("finished_at") - timedelta(seconds=3))
    running = make_job(state="running", worker_id="node-2:9:default:0")
    Job.objects.filter(pk=running.pk).update(last_attempted_at=timezone.now() - timedelta(minutes=4))
    make_pump("node-2:9:default:0")

    content = admin_client.get(CHANGELIST).content.decode()

    assert "PaymentDeclined: card declined (code 51)" in content
    assert "250 ms" in content  # the latest attempt's duration (make_attempt: 250 ms)
    assert "4 min 0" in content  # the running job, so far
    pump_url = reverse("admin:backwave_pump_change", args=["node-2:9:default:0"])
    assert f'href="{pump_url}"' in content  # a job links to its pump...
    assert 'title="node-1:7:default:0: this pump has stopped' in content  # ...or says it is gone


def test_search_finds_running_jobs_too(admin_client):
    # The GIN indexes leave running rows out; the search reads those through the running index.
    running = make_job(state="running", payload=kw(order_id=5), tags=["vip"])
    done = make_job(state="succeeded", payload=kw(order_id=5), tags=["vip"])
    assert listed(admin_client, q="order_id=5") == [done.pk, running.pk]
    assert listed(admin_client, q="tag:vip") == [done.pk, running.pk]
    assert listed(admin_client, tag="vip", state="running") == [running.pk]


def test_a_pump_links_to_its_running_jobs(admin_client):
    mine = make_job(state="running", worker_id="node-2:9:default:0")
    make_job(state="running", worker_id="node-3:1:default:0")
    make_job(state="succeeded", worker_id="node-2:9:default:0")
    make_pump("node-2:9:default:0")

    page = admin_client.get(reverse("admin:backwave_pump_changelist")).content.decode()
    assert "?state=running&amp;worker=node-2%3A9%3Adefault%3A0" in page

    response = admin_client.get(CHANGELIST, {"state": "running", "worker": "node-2:9:default:0"})
    assert [j.pk for j in response.context["cl"].result_list] == [mine.pk]
    assert "node-2:9:default:0" in response.content.decode()  # the filter shows while set


# --- history --------------------------------------------------------------------------------------


def history(job) -> list[tuple[str, int, str]]:
    return [
        (e.user.username, e.action_flag, e.change_message) for e in LogEntry.objects.filter(object_id=str(job.pk)).order_by("id")
    ]


def test_every_action_is_recorded_with_who_did_it(operator_client, operator_user):
    ticked, detail = make_job(state="failed"), make_job(state="failed")
    ready = make_job()
    operator_client.post(CHANGELIST, {"action": "retry_now", "_selected_action": [ticked.pk], "index": 0})
    operator_client.post(change_url(detail), {"CHANGE_FORM-action": "retry_now", "_selected_action": detail.pk})
    operator_client.post(CHANGELIST, {"action": "cancel", "_selected_action": [ready.pk], "index": 0})

    assert history(ticked) == [("operator", CHANGE, "Retried: ready to run now, with one more attempt (was failed).")]
    assert history(detail) == [("operator", CHANGE, "Retried: ready to run now, with one more attempt (was failed).")]
    assert history(ready) == [("operator", CHANGE, "Cancelled (was ready).")]
    # The job's own History page lists it.
    page = operator_client.get(reverse("admin:backwave_job_history", args=[ticked.pk])).content.decode()
    assert "Retried: ready to run now" in page and "operator" in page


def test_a_refused_job_gets_no_history(operator_client):
    running = make_job(state="running")
    operator_client.post(CHANGELIST, {"action": "retry_now", "_selected_action": [running.pk], "index": 0})
    assert history(running) == []


# --- retry all / cancel all matching ---------------------------------------------------------------


def test_retry_all_asks_first_saying_how_many(operator_client):
    for _ in range(3):
        make_job(state="failed", queue="emails")
    make_job(state="quarantined", queue="emails")
    make_job(state="succeeded", queue="emails")
    other = make_job(state="failed", queue="reports")

    page = operator_client.get(RETRY_ALL, {"queue": "emails"})

    content = page.content.decode()
    assert page.status_code == 200
    assert "This will retry <strong>4</strong> failed, quarantined or held jobs" in content
    assert "queue=emails" in content
    assert Job.objects.get(pk=other.pk).state == "failed"  # nothing happens on GET
    assert Job.objects.filter(state="failed").count() == 4


def test_retry_all_acts_on_the_filter_in_bounded_batches(operator_client, monkeypatch):
    monkeypatch.setattr(operations, "BATCH_SIZE", 2)
    emails = [make_job(state="failed", queue="emails") for _ in range(5)]
    other = make_job(state="failed", queue="reports")
    ready = make_job(queue="emails")

    response = operator_client.post(RETRY_ALL + "?queue=emails", follow=True)

    assert response.redirect_chain[-1][0] == CHANGELIST + "?queue=emails"
    assert messages_of(response)[:2] == ["Retried 5 jobs.", "Done in 3 batches of up to 2 jobs, each committed on its own."]
    assert set(Job.objects.filter(pk__in=[j.pk for j in emails]).values_list("state", flat=True)) == {"ready"}
    assert Job.objects.get(pk=other.pk).state == "failed"
    assert Job.objects.get(pk=ready.pk).state == "ready"
    entries = LogEntry.objects.filter(action_flag=CHANGE)
    assert entries.count() == 5
    assert all("by “retry all matching” (queue=emails)" in e.change_message for e in entries)


def test_retry_all_under_a_search(operator_client):
    mine = make_job(state="failed", payload=kw(customer_id=42))
    theirs = make_job(state="failed", payload=kw(customer_id=43))
    operator_client.post(RETRY_ALL + "?q=customer_id%3D42")
    assert Job.objects.get(pk=mine.pk).state == "ready"
    assert Job.objects.get(pk=theirs.pk).state == "failed"


def test_cancel_all_cancels_only_ready_jobs_matching(operator_client):
    due = make_job(queue="emails")
    later = make_job(queue="emails", run_at=timezone.now() + timedelta(hours=1))
    running = make_job(queue="emails", state="running")
    elsewhere = make_job(queue="reports")

    page = " ".join(operator_client.get(CANCEL_ALL, {"queue": "emails", "state": "scheduled"}).content.decode().split())
    assert "This will cancel <strong>1</strong> ready, scheduled, waiting or held job matching" in page
    operator_client.post(CANCEL_ALL + "?queue=emails&state=scheduled")
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {due.pk: "ready", later.pk: "cancelled", running.pk: "running", elsewhere.pk: "ready"}


def test_retry_all_with_nothing_to_do_says_so(operator_client):
    make_job()
    content = operator_client.get(RETRY_ALL, {"state": "ready"}).content.decode()
    assert "No failed, quarantined or held job matches" in content
    assert 'id="bw-bulk-confirm"' not in content


def test_retry_all_needs_the_retry_permission(client, readonly_user):
    failed = make_job(state="failed")
    client.force_login(readonly_user)
    assert client.get(RETRY_ALL).status_code == 403
    assert client.post(RETRY_ALL).status_code == 403
    assert Job.objects.get(pk=failed.pk).state == "failed"
    assert 'id="bw-retry-all"' not in client.get(CHANGELIST).content.decode()

    canceller = staff_user("canceller", ["view_job", "cancel_job"])
    client.force_login(canceller)
    content = client.get(CHANGELIST, {"queue": "emails"}).content.decode()
    assert 'id="bw-retry-all"' not in content
    assert f'href="{CANCEL_ALL}?queue=emails"' in content
    assert client.post(RETRY_ALL).status_code == 403


def test_an_unknown_bulk_action_is_refused(operator_client):
    assert operator_client.get(reverse("admin:backwave_job_bulk", args=["delete-all"])).status_code == 403


def test_select_all_in_the_list_also_goes_in_batches(operator_client, monkeypatch):
    monkeypatch.setattr(operations, "BATCH_SIZE", 2)
    failed = [make_job(state="failed") for _ in range(5)]
    data = {"action": "retry_now", "_selected_action": [failed[0].pk], "select_across": "1", "index": 0}
    response = operator_client.post(CHANGELIST + "?state=failed", data, follow=True)
    assert messages_of(response) == ["Retried 5 jobs."]
    assert LogEntry.objects.count() == 5


def test_the_confirmation_page_queries_are_pinned(operator_client, django_assert_num_queries):
    for _ in range(3):
        job = make_job(state="failed")
        make_attempt(job, 1)
    operator_client.get(RETRY_ALL)
    # Session, user, the user's and their groups' permissions, planner statistics (the
    # filters), the matching count, the halted-pump banner: no page of rows.
    with django_assert_num_queries(7):
        assert operator_client.get(RETRY_ALL, {"state": "failed"}).status_code == 200


def test_the_confirmation_page_for_a_superuser_needs_no_permission_queries(admin_client, django_assert_num_queries):
    make_job(state="failed")
    admin_client.get(RETRY_ALL)
    with django_assert_num_queries(5):  # session, user, statistics, the matching count, the banner
        assert admin_client.get(RETRY_ALL, {"q": "tag:vip"}).status_code == 200


# --- the job page ----------------------------------------------------------------------------------


DJANGO_FRAME = '  File "/usr/lib/python3/site-packages/django/db/backends/utils.py", line 105, in _execute\n    return self.cursor.execute(sql, params)\n'
BACKWAVE_FRAME = '  File "/srv/venv/lib/python3.12/site-packages/backwave/shell/execution.py", line 180, in run\n    result = task.call(*args, **kwargs)\n           ^^^^^^^^^^^^^^^^^^^^^^^^^^\n'
OWN_FRAME = '  File "/app/shop/tasks.py", line 12, in charge\n    raise PaymentDeclined("card declined")\n'
TRACEBACK = f"Traceback (most recent call last):\n{BACKWAVE_FRAME}{OWN_FRAME}{DJANGO_FRAME}shop.errors.PaymentDeclined: card declined\nsecond line of the message\n"


def test_the_attempts_table_shows_the_message_and_folds_the_machinery(admin_client):
    job = make_job(state="failed", attempts=1)
    make_attempt(job, 1, "failed", error_class="shop.errors.PaymentDeclined", traceback=TRACEBACK)

    content = admin_client.get(change_url(job)).content.decode()

    assert '<div class="error-message">card declined second line of the message</div>' in content
    assert "Show the 2 frames of BackWave, Django and asgiref" in content
    assert (
        '<span class="bw-machinery">  File &quot;/srv/venv/lib/python3.12/site-packages/backwave/shell/execution.py&quot;'
        in content
    )
    assert '<span class="bw-machinery">  File &quot;/usr/lib/python3/site-packages/django/db/backends/utils.py&quot;' in content
    assert (
        "  File &quot;/app/shop/tasks.py&quot;, line 12, in charge\n    raise PaymentDeclined" in content
    )  # the task's own, shown
    assert content.count("frame of BackWave, Django or asgiref hidden") == 2  # one marker per folded run


def test_a_lapsed_attempt_shows_when_it_last_ran_not_when_the_lapse_was_noticed(admin_client):
    job = make_job(state="ready", attempts=1)
    attempt = make_attempt(
        job,
        1,
        "lapsed",
        error_class="backwave.results.LeaseLapsed",
        traceback="backwave.results.LeaseLapsed: the lease of worker w expired",
    )
    Attempt.objects.filter(pk=attempt.pk).update(
        started_at=F("finished_at") - timedelta(minutes=10), lease_renewed_at=F("finished_at") - timedelta(minutes=9, seconds=30)
    )
    row = admin_client.get(change_url(job)).context["attempt_rows"][0]
    assert row["duration"] == 30.0
    assert row["duration_shown"] == "≥ 30.000 s"
    assert row["error_message"] == "the lease of worker w expired"


@pytest.mark.parametrize(
    ("state", "offered"),
    [
        ("failed", ["retry_now"]),
        ("quarantined", ["retry_now"]),
        ("ready", ["cancel"]),
        ("running", []),
        ("succeeded", []),
        ("cancelled", []),
    ],
)
def test_the_job_page_offers_only_the_actions_that_apply(operator_client, state, offered):
    job = make_job(state=state)
    content = operator_client.get(change_url(job)).content.decode()
    for name in ("retry_now", "cancel"):
        assert (f'<option value="{name}"' in content) == (name in offered), name


def test_the_job_page_query_count_with_a_worker(admin_client, django_assert_num_queries):
    from django.contrib.contenttypes.models import ContentType

    job = make_job(state="failed", attempts=1, worker_id="node-1:1:default:0")
    make_attempt(job, 1)
    ContentType.objects.clear_cache()
    with django_assert_num_queries(8):  # the seven of a job page (with its workflow), and its pump's row for the link
        assert admin_client.get(change_url(job)).status_code == 200


# --- redaction --------------------------------------------------------------------------------------


SECRET = "sk-live-SECRET-42"


def test_sensitive_arguments_and_results_are_hidden_everywhere_in_the_admin(admin_client):
    job = make_job(
        state="succeeded",
        attempts=1,
        payload={"args": [1], "kwargs": {"api_key": SECRET, "nested": {"Password": SECRET}, "to": "ann"}},
        return_value={"session_token": SECRET, "rows": 3},
    )
    make_attempt(job, 1, "succeeded", return_value={"session_token": SECRET, "rows": 3})

    page = admin_client.get(change_url(job)).content.decode()
    listing = admin_client.get(CHANGELIST).content.decode()

    assert SECRET not in page and SECRET not in listing
    assert page.count("********************") == 4  # api_key, nested Password, and the token in both results
    assert "&quot;to&quot;: &quot;ann&quot;" in page  # the rest is shown
    assert Job.objects.get(pk=job.pk).payload["kwargs"]["api_key"] == SECRET  # stored whole


def test_redaction_follows_the_setting(admin_client, settings):
    settings.BACKWAVE = {"REDACT_KEYS": r"^iban$"}
    job = make_job(payload=kw(iban="DE89 3704", password="shown-now"))
    page = admin_client.get(change_url(job)).content.decode()
    assert "DE89 3704" not in page and "shown-now" in page
    settings.BACKWAVE = {"REDACT_KEYS": None}
    assert "DE89 3704" in admin_client.get(change_url(job)).content.decode()


# --- time zone ----------------------------------------------------------------------------------------


def test_times_are_in_djangos_time_zone_and_say_which(admin_client, settings):
    settings.TIME_ZONE = "Asia/Tokyo"
    job = make_job(state="failed")
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.make_aware(timezone.datetime(2026, 3, 1, 12, 0, 5), timezone.UTC))

    content = admin_client.get(CHANGELIST).content.decode()

    assert 'data-server-zone="Asia/Tokyo"' in content
    assert (
        '<time datetime="2026-03-01T12:00:05+00:00" data-bw-time title="2026-03-01 21:00:05 Asia/Tokyo">03-01 21:00:05</time>'
        in content
    )
    assert "backwave/local_times.js" in content


def test_the_job_page_names_its_time_zone_too(admin_client, settings):
    settings.TIME_ZONE = "America/New_York"
    job = make_job(state="failed", attempts=1)
    make_attempt(job, 1)
    content = admin_client.get(change_url(job)).content.decode()
    assert 'data-server-zone="America/New_York"' in content
    assert "data-bw-precise" in content


def test_an_empty_search_lists_everything_and_a_lease_id_is_no_search(admin_client):
    job = make_job()
    assert listed(admin_client, q="   ") == [job.pk]
    assert listed(admin_client, q=str(uuid.uuid4())) == []

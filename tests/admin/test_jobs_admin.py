"""The Jobs pages: filters, search, the bounded paginator, the detail page, retry and cancel."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse
from django.utils import timezone

from backwave.ops import stats as admin_stats
from backwave.models import Job

from .conftest import make_attempt, make_job

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:backwave_job_changelist")


def change_url(job):
    return reverse("admin:backwave_job_change", args=[job.pk])


def listed_ids(response) -> list[int]:
    return [job.pk for job in response.context["cl"].result_list]


def run_action(client, action, *jobs, follow=True):
    data = {"action": action, "_selected_action": [job.pk for job in jobs], "index": 0}
    return client.post(CHANGELIST, data, follow=follow)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- list, filters, search ---------------------------------------------------------------------


def test_state_filter_splits_ready_into_due_and_scheduled(admin_client):
    due = make_job()
    later = make_job(run_at=timezone.now() + timedelta(hours=1))
    failed = make_job(state="failed")

    assert listed_ids(admin_client.get(CHANGELIST, {"state": "ready"})) == [due.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"state": "scheduled"})) == [later.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"state": "failed"})) == [failed.pk]
    assert listed_ids(admin_client.get(CHANGELIST)) == [failed.pk, later.pk, due.pk]


def test_queue_and_task_filters(admin_client):
    email = make_job(queue="emails", task_path="project.demo.tasks.email_job")
    make_job(queue="default", task_path="project.demo.tasks.fast_job")

    assert listed_ids(admin_client.get(CHANGELIST, {"queue": "emails"})) == [email.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"task": "project.demo.tasks.email_job"})) == [email.pk]
    response = admin_client.get(CHANGELIST)
    content = response.content.decode()
    # Choices come from settings and registered tasks, not from a DISTINCT over the table.
    assert "?queue=reports" in content
    assert "?task=project.demo.tasks.failing_job" in content


def test_search_by_id_and_by_task(admin_client):
    first = make_job(task_path="project.demo.tasks.email_job")
    second = make_job(task_path="project.demo.tasks.report_job")

    assert listed_ids(admin_client.get(CHANGELIST, {"q": str(second.pk)})) == [second.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"q": f"#{first.pk}"})) == [first.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"q": "report"})) == [second.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"q": "9" * 25})) == []


ARABIC_INDIC_DIGITS = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH_DIGITS = str.maketrans("0123456789", "０１２３４５６７８９")


@pytest.mark.parametrize("term", ["²", "#²", "¹²", "⑦"])
def test_search_for_a_digit_int_refuses_finds_nothing_instead_of_failing(admin_client, term):
    # str.isdigit() is true for superscripts and circled digits, which int() refuses.
    make_job()
    response = admin_client.get(CHANGELIST, {"q": term})
    assert response.status_code == 200
    assert listed_ids(response) == []


def test_search_for_a_non_ascii_number_is_no_job_id(admin_client):
    # int() reads Arabic-Indic digits as a number: only ASCII digits name a job.
    job = make_job(task_path="project.demo.tasks.email_job")
    for digits in (ARABIC_INDIC_DIGITS, FULLWIDTH_DIGITS):
        term = str(job.pk).translate(digits)
        assert listed_ids(admin_client.get(CHANGELIST, {"q": term})) == []
    assert listed_ids(admin_client.get(CHANGELIST, {"q": str(job.pk)})) == [job.pk]


def test_the_count_is_bounded_and_then_estimated(admin_client, monkeypatch):
    monkeypatch.setattr(admin_stats.EstimatedCountPaginator, "cap", 5)
    for _ in range(8):
        make_job()
    response = admin_client.get(CHANGELIST)
    paginator = response.context["cl"].paginator
    assert paginator.estimated
    assert paginator.count >= 6  # at least cap + 1, else the planner's figure
    assert "about" in response.content.decode()
    assert "results (" not in response.content.decode()  # no count beside the search box unfiltered
    searched = admin_client.get(CHANGELIST, {"q": "noop"}).content.decode()
    assert re.search(r"about [\d,]+ results", searched)

    small = admin_client.get(CHANGELIST, {"state": "failed"})
    assert not small.context["cl"].paginator.estimated
    assert small.context["cl"].paginator.count == 0


# --- detail ------------------------------------------------------------------------------------


def test_detail_page_shows_every_attempt(admin_client):
    job = make_job(state="failed", attempts=2, max_attempts=2, queue="emails")
    make_attempt(job, 1, "failed", error_class="builtins.ValueError", traceback="Traceback ...\nValueError: first try")
    make_attempt(job, 2, "failed", worker_id="node-7:99:default:0", traceback="Traceback ...\nRuntimeError: second try")

    response = admin_client.get(change_url(job))

    content = response.content.decode()
    assert response.status_code == 200
    assert [row["attempt"].number for row in response.context["attempt_rows"]] == [1, 2]
    assert [row["duration"] for row in response.context["attempt_rows"]] == [0.25, 0.25]
    for text in ("builtins.ValueError", "ValueError: first try", "RuntimeError: second try", "node-7:99:default:0", "250.00 ms"):
        assert text in content
    assert 'id="attempts"' in content


def test_detail_page_shows_a_success_and_its_return_value(admin_client):
    job = make_job(state="succeeded", attempts=1, return_value={"rows": 42})
    make_attempt(job, 1, "succeeded", return_value={"rows": 42})
    content = admin_client.get(change_url(job)).content.decode()
    assert '<code class="attempt-return-value">{&quot;rows&quot;: 42}</code>' in content  # the attempt's, as JSON
    assert "&quot;rows&quot;: 42" in content  # the job's return value, as JSON


def test_detail_page_of_a_running_job_shows_the_attempt_in_progress(admin_client):
    job = make_job(state="running", worker_id="node-1:7:default:0")
    content = admin_client.get(change_url(job)).content.decode()
    assert "attempt-running" in content
    # A superuser holds cancel_running_job: the page offers to stop it (test_cancel_running.py).
    assert "choose “Cancel” below to ask its worker to stop it" in content


@pytest.mark.parametrize("object_id", ["²", "⑦", "9" * 25, "-1", "0x1f"])
def test_a_job_url_with_a_bad_id_is_not_found(admin_client, object_id):
    make_job()
    response = admin_client.get(reverse("admin:backwave_job_change", args=[object_id]), follow=True)
    assert response.status_code == 200
    assert [m for m in messages_of(response) if "doesn’t exist" in m]


def test_a_job_url_with_a_non_ascii_number_is_not_that_job(admin_client):
    job = make_job()
    url = reverse("admin:backwave_job_change", args=[str(job.pk).translate(ARABIC_INDIC_DIGITS)])
    response = admin_client.get(url, follow=True)
    assert [m for m in messages_of(response) if "doesn’t exist" in m]
    assert "attempt_rows" not in response.context


@pytest.mark.parametrize("selected", ["²", "abc", "9" * 25])
def test_an_action_on_a_bad_id_says_so_and_changes_nothing(operator_client, selected):
    failed = make_job(state="failed")
    data = {"action": "retry_now", "_selected_action": [str(failed.pk), selected], "index": 0}
    response = operator_client.post(CHANGELIST, data, follow=True)
    assert response.status_code == 200
    assert f"{selected!r} is not a job id" in " ".join(messages_of(response))
    assert Job.objects.get(pk=failed.pk).state == "failed"


# --- actions -----------------------------------------------------------------------------------


def test_retry_makes_failed_and_quarantined_jobs_ready_with_one_more_attempt(operator_client):
    failed = make_job(state="failed", attempts=3, max_attempts=3)
    quarantined = make_job(state="quarantined", attempts=1, max_attempts=5)

    response = run_action(operator_client, "retry_now", failed, quarantined)

    assert messages_of(response) == ["Retried 2 jobs."]
    failed.refresh_from_db()
    quarantined.refresh_from_db()
    assert (failed.state, failed.max_attempts, failed.finished_at) == ("ready", 4, None)
    assert (quarantined.state, quarantined.max_attempts) == ("ready", 5)
    assert failed.run_at <= timezone.now()


def test_retry_refuses_running_jobs_with_a_clear_message(operator_client):
    running = make_job(state="running")
    succeeded = make_job(state="succeeded")

    response = run_action(operator_client, "retry_now", running, succeeded)

    assert messages_of(response) == [
        "1 job is running under a worker's lease and was left alone: try again once it finishes.",
        "Only failed, quarantined or held jobs can be retried; left alone: 1 succeeded.",
    ]
    assert Job.objects.get(pk=running.pk).state == "running"
    assert Job.objects.get(pk=succeeded.pk).state == "succeeded"


def test_cancel_cancels_ready_and_scheduled_jobs_only(operator_client):
    due = make_job()
    later = make_job(run_at=timezone.now() + timedelta(hours=1))
    running = make_job(state="running")
    failed = make_job(state="failed")

    response = run_action(operator_client, "cancel", due, later, running, failed)

    assert messages_of(response) == [
        "Cancelled 2 jobs.",
        "1 job is running under a worker's lease and was left alone: try again once it finishes.",
        "Only ready, scheduled, waiting or held jobs can be cancelled; left alone: 1 failed.",
    ]
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {due.pk: "cancelled", later.pk: "cancelled", running.pk: "running", failed.pk: "failed"}
    assert Job.objects.get(pk=due.pk).finished_at is not None


def test_a_job_deleted_since_the_page_loaded_is_reported_gone(operator_client):
    failed, purged = make_job(state="failed"), make_job(state="failed")
    Job.objects.filter(pk=purged.pk).delete()  # the retention purge, between the listing and the click

    response = run_action(operator_client, "retry_now", failed, purged)

    assert messages_of(response) == [
        "Retried 1 job.",
        f"Job {purged.pk} no longer exists (deleted since the page was loaded, e.g. by the retention purge).",
    ]


def test_ticked_jobs_are_reported_in_their_state_now_even_past_the_filter(operator_client):
    failed = make_job(state="failed")
    url = CHANGELIST + "?state=failed"
    page = operator_client.get(url)
    assert listed_ids(page) == [failed.pk]
    Job.objects.filter(pk=failed.pk).update(state="ready")  # another operator retried it meanwhile

    data = {"action": "retry_now", "_selected_action": [failed.pk], "index": 0}
    response = operator_client.post(url, data, follow=True)

    assert messages_of(response) == ["Only failed, quarantined or held jobs can be retried; left alone: 1 ready."]


def test_select_all_acts_on_every_job_the_filters_match(operator_client):
    failed = [make_job(state="failed", queue="emails") for _ in range(3)]
    other = make_job(state="failed", queue="reports")
    data = {"action": "retry_now", "_selected_action": [failed[0].pk], "select_across": "1", "index": 0}

    response = operator_client.post(CHANGELIST + "?queue=emails", data, follow=True)

    assert messages_of(response) == ["Retried 3 jobs."]
    assert Job.objects.get(pk=other.pk).state == "failed"


def test_retry_from_the_detail_page(operator_client):
    job = make_job(state="failed", attempts=1, max_attempts=1)
    response = operator_client.post(change_url(job), {"CHANGE_FORM-action": "retry_now", "_selected_action": job.pk}, follow=True)
    assert response.redirect_chain[-1][0] == change_url(job)
    assert "Retried 1 job." in messages_of(response)
    assert Job.objects.get(pk=job.pk).state == "ready"


def test_read_only_user_sees_jobs_but_no_action(readonly_client):
    job = make_job(state="failed")
    listing = readonly_client.get(CHANGELIST)
    assert listing.status_code == 200
    assert 'name="action"' not in listing.content.decode()
    detail = readonly_client.get(change_url(job))
    assert detail.status_code == 200
    assert 'id="job-retry-refused"' in detail.content.decode()
    assert 'name="CHANGE_FORM-action"' not in detail.content.decode()


def test_read_only_user_is_refused_when_posting_an_action(readonly_client):
    job = make_job(state="failed")
    assert run_action(readonly_client, "retry_now", job, follow=False).status_code == 403
    response = readonly_client.post(change_url(job), {"CHANGE_FORM-action": "retry_now", "_selected_action": job.pk})
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).state == "failed"


def test_each_action_needs_its_own_permission(client):
    from .conftest import staff_user

    user = staff_user("retrier", ["view_job", "retry_job"])
    client.force_login(user)
    content = client.get(CHANGELIST).content.decode()
    assert 'value="retry_now"' in content
    assert 'value="cancel"' not in content
    job = make_job()
    assert run_action(client, "cancel", job, follow=False).status_code == 403
    assert Job.objects.get(pk=job.pk).state == "ready"


def test_nobody_adds_edits_or_deletes_jobs_by_hand(admin_client):
    job = make_job()
    assert admin_client.get(reverse("admin:backwave_job_add")).status_code == 403
    assert admin_client.get(reverse("admin:backwave_job_delete", args=[job.pk])).status_code == 403
    content = admin_client.get(change_url(job)).content.decode()
    assert 'name="_save"' not in content


# --- query counts ------------------------------------------------------------------------------

# Session, user, planner statistics (queue, task and tag filters), bounded count, the page of
# rows, the page's details (latest attempts, running times, pumps), the halted-pump banner.
JOB_LIST_QUERIES = 7
# Session, user, the job, its attempts, the content type (the action form's history link),
# the banner, the workflow (ancestors and dependents, one statement); a job that has a worker
# adds one probe for its pump's row (the link).
JOB_DETAIL_QUERIES = 7


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"state": "failed", "queue": "emails"},
        {"q": "noop"},
        {"q": "order=7"},
        {"q": "tag:vip noop"},
        {"tag": "vip"},
        {"worker": "host:1:default:0", "state": "running"},
    ],
)
def test_job_list_queries_are_pinned(admin_client, django_assert_num_queries, params):
    for state in ("ready", "running", "failed", "succeeded"):
        for n in range(3):
            job = make_job(
                state=state,
                queue="emails" if n else "default",
                tags=["vip"] if n == 1 else [],
                payload={"args": [], "kwargs": {"order": 7 if n == 2 else n}},
            )
            if state in ("failed", "succeeded"):
                make_attempt(job, 1, state)
    admin_client.get(CHANGELIST)  # warm the task registry and caches
    with django_assert_num_queries(JOB_LIST_QUERIES):
        response = admin_client.get(CHANGELIST, params)
    assert response.status_code == 200
    assert listed_ids(response)  # every case lists rows, so the page's details query runs


def test_job_list_with_no_rows_reads_no_details(admin_client, django_assert_num_queries):
    make_job()
    admin_client.get(CHANGELIST)
    with django_assert_num_queries(JOB_LIST_QUERIES - 1):
        assert listed_ids(admin_client.get(CHANGELIST, {"state": "failed"})) == []


def test_job_list_past_the_cap_adds_one_explain(admin_client, django_assert_num_queries, monkeypatch):
    monkeypatch.setattr(admin_stats.EstimatedCountPaginator, "cap", 2)
    for _ in range(4):
        make_job()
    admin_client.get(CHANGELIST)
    with django_assert_num_queries(JOB_LIST_QUERIES + 1):
        admin_client.get(CHANGELIST)


def test_job_detail_queries_are_pinned(admin_client, django_assert_num_queries):
    job = make_job(state="failed", attempts=3)
    for number in (1, 2, 3):
        make_attempt(job, number)
    ContentType.objects.clear_cache()
    with django_assert_num_queries(JOB_DETAIL_QUERIES):
        assert admin_client.get(change_url(job)).status_code == 200

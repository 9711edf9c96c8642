"""Whatever an operator types or a link carries, the console answers with a clear message (a
CommandError in the CLI), never a 500 or a traceback: a NUL, a value nested past any sane
depth, a search that can match nothing."""

from __future__ import annotations

import io
from urllib.parse import urlencode

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.urls import reverse

from backwave.models import Job

from .conftest import make_job

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:backwave_job_changelist")
RETRY_ALL = reverse("admin:backwave_job_bulk", args=["retry-all"])
CANCEL_ALL = reverse("admin:backwave_job_bulk", args=["cancel-all"])
DEEP = "[" * 5000 + "]" * 5000
NUL = "\x00"


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


@pytest.mark.parametrize(
    ("parameter", "value"),
    [
        ("queue", NUL),
        ("task", NUL),
        ("tag", NUL),
        ("worker", NUL),
        ("queue", f"a{NUL}b"),
        ("q", NUL),
        ("q", f"order_id={NUL}"),
        ("q", f"tag:{NUL}"),
        ("q", f"arg:{NUL}"),
        ("q", f"'{NUL}'"),
        ("q", f"order_id={DEEP}"),
        ("q", f"arg:{DEEP}"),
        ("q", "order_id=" + '{"a":' * 5000 + "1" + "}" * 5000),
    ],
)
def test_the_jobs_list_answers_bad_values_with_a_message(admin_client, parameter, value):
    make_job(state="failed")
    response = admin_client.get(CHANGELIST, {parameter: value}, follow=True)
    assert response.status_code == 200
    assert messages_of(response), "no message says what was wrong"


@pytest.mark.parametrize("url", [RETRY_ALL, CANCEL_ALL])
@pytest.mark.parametrize("query", [{"q": "#0"}, {"q": "9" * 25}, {"q": NUL}, {"queue": NUL}])
def test_a_bulk_action_on_a_selection_that_matches_nothing_changes_nothing(admin_client, url, query):
    failed, ready = make_job(state="failed"), make_job()
    page = admin_client.get(url, query, follow=True)
    assert page.status_code == 200
    done = admin_client.post(f"{url}?{urlencode(query)}", follow=True)
    assert done.status_code == 200
    assert set(Job.objects.values_list("id", "state")) == {(failed.pk, "failed"), (ready.pk, "ready")}


def test_a_bulk_post_on_an_impossible_search_reports_nothing_done(admin_client):
    make_job(state="failed")
    response = admin_client.post(f"{RETRY_ALL}?q=%230", follow=True)
    assert response.status_code == 200
    assert Job.objects.filter(state="failed").count() == 1


@pytest.mark.parametrize(
    "args",
    [
        ("--search", NUL),
        ("--search", f"order_id={NUL}"),
        ("--search", f"order_id={DEEP}"),
        ("--search", f"arg:{DEEP}"),
        ("--queue", NUL),
        ("--task", NUL),
        ("--tag", NUL),
    ],
)
@pytest.mark.parametrize("verb", ["list", "retry"])
def test_the_cli_answers_bad_values_with_a_command_error(args, verb):
    make_job(state="failed")
    extra = ("--yes",) if verb == "retry" else ()
    with pytest.raises(CommandError):
        call_command("backwave_jobs", verb, *args, *extra, stdout=io.StringIO())
    assert Job.objects.filter(state="failed").count() == 1


def test_the_cli_acting_on_an_impossible_search_does_nothing():
    make_job(state="failed")
    out = io.StringIO()
    call_command("backwave_jobs", "retry", "--search", "#0", "--yes", stdout=out)
    assert "Nothing to retry" in out.getvalue()

"""What the commands' listings say about what they do not show: ``backwave_jobs list`` names the
rows past its page, and ``backwave_queue list`` lists the declared queues, rows or not."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from backwave.management.commands import backwave_jobs
from backwave.models import Queue
from tests.admin.conftest import make_job

pytestmark = pytest.mark.django_db


def listing(*args) -> tuple[list[str], str]:
    out, err = StringIO(), StringIO()
    call_command("backwave_jobs", "list", *args, stdout=out, stderr=err)
    return out.getvalue().splitlines(), err.getvalue()


def test_a_page_of_jobs_says_how_many_more_match_and_how_to_see_them():
    """50 of 101 jobs were shown with no word that 51 more exist."""
    ids = [make_job(queue="emails").pk for _ in range(101)]
    lines, _ = listing()
    assert [line.split()[0] for line in lines[1:51]] == [str(i) for i in sorted(ids, reverse=True)[:50]]
    assert lines[51:] == [
        "Showing 1-50 of 101 matching jobs, newest first: --offset 50 shows the next 50 (or give a larger --limit)."
    ]

    lines, _ = listing("--offset", "100")
    assert lines[1].split()[0] == str(min(ids))
    assert lines[2:] == ["Showing 101-101 of 101 matching jobs, newest first."]
    lines, _ = listing("--offset", "101")
    assert lines == ["No job at --offset 101: 101 match."]

    everything, _ = listing("--limit", "200")
    assert len(everything) == 102  # all shown: no footer

    rows, note = listing("--json")
    assert len(json.loads("\n".join(rows))) == 50  # stdout stays one JSON document
    assert (
        note.strip()
        == "Showing 1-50 of 101 matching jobs, newest first: --offset 50 shows the next 50 (or give a larger --limit)."
    )


def test_the_count_past_the_page_is_bounded(monkeypatch):
    monkeypatch.setattr(backwave_jobs, "COUNT_CAP", 60)
    for _ in range(70):
        make_job()
    lines, _ = listing()
    assert (
        lines[-1]
        == "Showing 1-50 of more than 60 matching jobs, newest first: --offset 50 shows the next 50 (or give a larger --limit)."
    )


def queue_listing(*args) -> list[str]:
    out = StringIO()
    call_command("backwave_queue", "list", *args, stdout=out)
    return out.getvalue().splitlines()


def test_the_queue_list_shows_the_declared_queues_before_any_row():
    """It printed "No queue rows: every queue is unpaused and unlimited." on a fresh install."""
    assert not Queue.objects.exists()
    make_job(queue="emails")
    make_job(queue="emails", state="failed")
    make_job(queue="stray")  # enqueued on no declared queue: shown too, marked so
    lines = queue_listing()
    header = lines[0].split()
    # Two databases in the test settings: each line says which one it is of.
    assert header[:5] == ["DATABASE", "QUEUE", "STATE", "LIMIT", "PER-KEY"]
    by_name = {line.split()[1]: line for line in lines[1:]}
    # TASKS' QUEUES (both backends), BACKWAVE["QUEUES"], and the job table's own.
    assert {"default", "emails", "reports", "remote", "keyed", "rated", "stray"} <= set(by_name)
    document = {row["queue"]: row for row in json.loads("\n".join(queue_listing("--json")))}
    assert document["emails"] | {"declared_in": None} == {
        "database": "default",
        "queue": "emails",
        "state": "active",
        "concurrency_limit": None,
        "key_concurrency_limit": None,
        "rate": "",
        "ready": 1,
        "scheduled": 0,
        "running": 0,
        "failed": 1,
        "quarantined": 0,
        "waiting": 0,
        "held": 0,
        "at_least": [],
        "has_row": False,
        "declared_in": None,
    }
    assert "TASKS['default']" in document["emails"]["declared_in"]
    assert document["remote"]["declared_in"] == ["TASKS['remote']", "WORKER_GROUPS 'remote'"]
    assert document["stray"]["declared_in"] == []
    # The admission limits the settings give, though no worker wrote them into a row yet.
    assert document["keyed"]["key_concurrency_limit"] == 2
    assert document["rated"]["rate"] == "50 / 1 s"
    assert "BACKWAVE['QUEUES']" in document["keyed"]["declared_in"]


def test_the_queue_list_shows_a_row_s_pause_and_limit():
    call_command("backwave_queue", "pause", "emails", stdout=StringIO())
    call_command("backwave_queue", "limit", "reports", "3", stdout=StringIO())
    document = {row["queue"]: row for row in json.loads("\n".join(queue_listing("--json")))}
    assert (document["emails"]["state"], document["emails"]["has_row"]) == ("paused", True)
    assert document["reports"]["concurrency_limit"] == 3
    by_name = {line.split()[1]: line.split()[1:] for line in queue_listing()[1:]}
    assert by_name["emails"][1:3] == ["paused", "-"]
    assert by_name["reports"][1:3] == ["active", "3"]

"""The commands' arguments are checked where they are parsed: a value out of range is a
CommandError naming the option and what it takes, and nothing is read or written with it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from backwave.models import Job
from tests.admin.conftest import make_job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--older-than", "9999999d"), r"--older-than: at most 100 years \(36,525d\), got '9999999d'"),
        (("--older-than", "1e400s"), r"--older-than: give a number and a unit"),
        (("--older-than", "9" * 400 + "s"), r"--older-than: at most 100 years"),
        (("--limit", "100000000000000000000"), r"--limit: a whole number from 1 to 100,000"),
        (("--limit", "1e20"), r"--limit: a whole number from 1 to 100,000"),
        (("--limit", "0"), r"--limit: a whole number from 1 to 100,000"),
        (("--offset", "-1"), r"--offset: a whole number from 0 to"),
        (("--offset", "100000000000000000000"), r"--offset: a whole number from 0 to"),
        (("--id", "100000000000000000000"), r"--id: a job id is a whole number from 1 to 9,223,372,036,854,775,807"),
    ],
)
def test_jobs_list_refuses_out_of_range_values_before_any_query(args, message, django_assert_num_queries):
    """--older-than 9999999d raised OverflowError; --limit 10**20 reached the LIMIT (DataError)."""
    make_job()
    with django_assert_num_queries(0), pytest.raises(CommandError, match=message):
        call_command("backwave_jobs", "list", *args, stdout=StringIO())


@pytest.mark.parametrize("verb", ["retry", "cancel", "purge"])
def test_jobs_actions_refuse_an_age_out_of_range_and_change_nothing(verb, django_assert_num_queries):
    make_job(state="failed")
    with (
        django_assert_num_queries(0),
        pytest.raises(CommandError, match=r"--older-than: at most 100 years \(36,525d\), got '9999999d'"),
    ):
        call_command("backwave_jobs", verb, "--older-than", "9999999d", "--yes", stdout=StringIO())
    assert Job.objects.get().state == "failed"


def test_the_show_id_is_checked_too(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(CommandError, match=r"ID: a job id is a whole number from 1 to"):
        call_command("backwave_jobs", "show", "100000000000000000000", stdout=StringIO())


@pytest.mark.parametrize("by", ["", "x" * 256, "a\x00b", "a\udce9b"])
def test_cancel_refuses_a_by_its_column_cannot_hold_as_the_api_does(by, django_assert_num_queries):
    """--by "a\\x00b" reached the UPDATE (a raw DataError); "" and 256 characters were stored or refused late."""
    job = make_job()
    with (
        django_assert_num_queries(0),
        pytest.raises(CommandError, match=r"--by: who cancels must be 1 to 255 characters without a NUL or a lone surrogate"),
    ):
        call_command("backwave_cancel", str(job.pk), "--by", by, stdout=StringIO())
    assert Job.objects.get(pk=job.pk).state == "ready"


def test_cancel_refuses_a_job_id_out_of_range(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(CommandError, match=r"JOB_ID: a job id is a whole number from 1 to"):
        call_command("backwave_cancel", "100000000000000000000", stdout=StringIO())


def test_keyword_options_of_call_command_meet_the_same_bounds(django_assert_num_queries):
    """call_command() hands keyword options to handle() without the parser's types."""
    job = make_job()
    with django_assert_num_queries(0):
        with pytest.raises(CommandError, match=r"--limit: a whole number from 1 to 100,000, got 100000000000000000000"):
            call_command("backwave_jobs", "list", limit=10**20, stdout=StringIO())
        with pytest.raises(CommandError, match=r"--older-than: at most 100 years"):
            call_command("backwave_jobs", "list", older_than="9999999d", stdout=StringIO())
        with pytest.raises(CommandError, match=r"--by: who cancels must be 1 to 255 characters"):
            call_command("backwave_cancel", str(job.pk), by="a\x00b", stdout=StringIO())
    assert Job.objects.get(pk=job.pk).state == "ready"


def test_the_limits_still_take_good_values():
    for _ in range(3):
        make_job()
    out = StringIO()
    call_command("backwave_jobs", "list", "--limit", "1", "--offset", "1", "--older-than", "0s", "--json", stdout=out)
    assert len(json.loads(out.getvalue())) == 1
    call_command("backwave_cancel", str(Job.objects.order_by("id").first().pk), "--by", "x" * 255, stdout=StringIO())
    assert list(Job.objects.filter(state="cancelled").values_list("cancel_requested_by", flat=True)) == ["x" * 255]

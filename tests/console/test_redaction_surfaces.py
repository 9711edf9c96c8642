"""Everything a surface shows that derives from a job's arguments or its task goes through one
redaction (``backwave.ops.redaction.redacted``): the payload, and also the uniqueness key and
the limit key made from those arguments, and the progress and metadata the handler reported."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from backwave.models import Job
from backwave.ops import redaction
from backwave.ops.redaction import REDACTED
from tests.console.redaction_tasks import call_vendor

SECRET = "sk-live-4f9a2c"


@pytest.fixture
def job(db):
    result = call_vendor.enqueue(order_id=7, api_token=SECRET)
    Job.objects.filter(pk=result.id).update(
        progress={"step": 2, "session_token": "sess-77a"}, metadata={"password": "pw-88b", "rows": 3}
    )
    return Job.objects.get(pk=result.id)


def test_the_stored_keys_hold_the_secret_that_every_surface_must_hide(job):
    # What the engine needs to compare keys is the value itself: it stays in the row.
    assert SECRET in job.unique_key and job.limit_key == SECRET


def test_the_job_page_shows_no_secret_from_keys_progress_or_metadata(admin_client, job):
    page = admin_client.get(f"/admin/backwave/job/{job.pk}/change/").content.decode()
    for secret in (SECRET, "sess-77a", "pw-88b"):
        assert secret not in page
    assert "order_id&quot;:7" in page  # the rest of the key stays readable
    assert page.count(REDACTED) >= 5  # payload, uniqueness key, limit key, progress, metadata


def test_the_jobs_list_shows_no_secret_from_a_running_jobs_progress(admin_client, job):
    Job.objects.filter(pk=job.pk).update(state="running", attempts=1, lease_id="6f1c8e5e-6f6a-4c63-9d0e-1d4f0c0f7a11")
    page = admin_client.get("/admin/backwave/job/").content.decode()
    assert "sess-77a" not in page and "&quot;step&quot;: 2" in page


def test_backwave_jobs_show_hides_the_same(job):
    out = io.StringIO()
    call_command("backwave_jobs", "show", str(job.pk), "--json", stdout=out)
    document = json.loads(out.getvalue())
    text = json.dumps(document)
    for secret in (SECRET, "sess-77a", "pw-88b"):
        assert secret not in text
    assert document["limit_key"] == REDACTED
    assert json.loads(document["unique_key"].partition(":")[2]) == {"api_token": REDACTED, "order_id": 7}
    assert document["progress"] == {"step": 2, "session_token": REDACTED}
    assert document["metadata"] == {"password": REDACTED, "rows": 3}


def test_one_function_redacts_each_field(job):
    assert redaction.redacted(job, "payload") == {"args": [], "kwargs": {"order_id": 7, "api_token": REDACTED}}
    assert redaction.redacted(job, "limit_key") == REDACTED
    assert SECRET not in redaction.redacted(job, "unique_key")
    with pytest.raises(ValueError, match="enqueued_at"):
        redaction.redacted(job, "enqueued_at")


def test_a_limit_key_from_an_ordinary_argument_stays_readable(job):
    Job.objects.filter(pk=job.pk).update(limit_key="acme")
    assert redaction.redacted(Job.objects.get(pk=job.pk), "limit_key") == "acme"


def test_nothing_is_hidden_when_redaction_is_off(settings, job):
    settings.BACKWAVE = {**settings.BACKWAVE, "REDACT_KEYS": None}
    assert redaction.redacted(job, "limit_key") == SECRET and redaction.redacted(job, "unique_key") == job.unique_key

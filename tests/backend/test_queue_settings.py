"""BACKWAVE["QUEUES"]: validated like every setting, written to the queues' rows at worker start."""

import pytest

from backwave import conf
from backwave.databases import apply_queue_settings
from backwave.checks import check_backwave_settings
from backwave.models import Queue


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"bad name!": {}}, "queue name 'bad name!'"),
        ({"reports": {"concurrency_limit": 0}}, "concurrency_limit'] must be a whole number >= 1"),
        ({"reports": {"concurrency_limit": 2**31}}, "concurrency_limit'] must be a whole number >= 1 (at most 2,147,483,647)"),
        ({"reports": {"paused": "yes"}}, "paused'] must be True or False"),
        ({"reports": {"limit": 2}}, "Did you mean 'concurrency_limit'?"),
        (["reports"], "a dict of queue settings"),
    ],
)
def test_bad_queue_settings_are_reported_by_the_system_check(settings, value, message):
    settings.BACKWAVE = {"QUEUES": value}
    errors = check_backwave_settings()
    assert [e.id for e in errors] == ["backwave.E003"]
    assert message in errors[0].msg


@pytest.mark.django_db
def test_the_worker_writes_configured_queue_settings_and_keeps_the_rest(settings):
    Queue.objects.create(name="emails", paused=True, concurrency_limit=7)
    settings.BACKWAVE = {"QUEUES": {"reports": {"concurrency_limit": 2}, "emails": {"paused": False}}}
    assert apply_queue_settings(conf.get_setting("QUEUES")) == 2
    assert Queue.objects.get(name="reports").concurrency_limit == 2
    emails = Queue.objects.get(name="emails")
    assert (emails.paused, emails.concurrency_limit) == (False, 7)

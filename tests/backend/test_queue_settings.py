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
        ({"reports": {"key_limit": 2}}, "Did you mean 'key_concurrency_limit'?"),
        ({"reports": {"key_concurrency_limit": 0}}, "key_concurrency_limit'] must be a whole number >= 1"),
        ({"reports": {"rate_limit": 1.5}}, "rate_limit'] must be a whole number >= 1"),
        ({"reports": {"rate_limit": 10, "rate_period": 0}}, "rate_period'] must be a number of seconds above 0"),
        ({"reports": {"rate_period": 5}}, "sets 'rate_period' (5) without 'rate_limit' or 'key_rate_limit'"),
        ({"reports": {"key_rate_limit": -1}}, "key_rate_limit'] must be a whole number >= 1"),
        ({"reports": {"key_rate": 3}}, "Did you mean 'key_rate_limit'?"),
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


@pytest.mark.django_db
def test_a_worker_writes_admission_limits_and_clears_those_the_settings_dropped(settings):
    from backwave.databases import write_queue_settings

    settings.BACKWAVE = {"QUEUES": {"api": {"key_concurrency_limit": 3, "rate_limit": 20, "key_rate_limit": 2}}}
    write_queue_settings("default", ["api", "reports"])
    api = Queue.objects.get(name="api")
    assert (api.key_concurrency_limit, api.rate_limit, api.key_rate_limit, api.rate_period) == (3, 20, 2, 1.0)
    assert not Queue.objects.filter(name="reports").exists()  # no limit, no row written
    assert conf.admitted_queue_names() == {"api"}
    # Dropped from the settings: a plain claim gives a limited row no room, so it is cleared.
    settings.BACKWAVE = {"QUEUES": {}}
    write_queue_settings("default", ["api"])
    api.refresh_from_db()
    assert (api.key_concurrency_limit, api.rate_limit, api.key_rate_limit, api.rate_period) == (None, None, None, None)

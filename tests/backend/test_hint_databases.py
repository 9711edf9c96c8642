"""BACKWAVE["HINT_DATABASES"]: the alias a worker's wake-up listener connects with (a direct
connection beside a transaction-pooling PgBouncer), validated where it is written."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.exceptions import ImproperlyConfigured

from backwave.management.commands.backwave_worker import _hint_listener


def problems():
    return [message.msg for message in checks.run_checks() if message.id == "backwave.E003"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"default": "direkt"}, "['HINT_DATABASES'] names 'direkt', which is not an alias of DATABASES."),
        ({"defualt": "other"}, "names 'defualt', which is not an alias of DATABASES. Did you mean 'default'?"),
        (["default"], "must be a dict of DATABASES alias -> DATABASES alias"),
        ({"default": 1}, "must be a dict of DATABASES alias -> DATABASES alias"),
    ],
)
def test_a_bad_value_fails_the_check(settings, value, message):
    settings.BACKWAVE = {"HINT_DATABASES": value}
    (problem,) = problems()
    assert message in problem


def test_a_bad_value_stops_the_worker_at_start(settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "HINT_DATABASES": {"default": "direkt"}}
    with pytest.raises(ImproperlyConfigured, match="not an alias of DATABASES"):
        call_command("backwave_worker", "--queues", "e2e", "--until-idle")


def test_the_listener_connects_through_the_alias_named(settings):
    settings.DATABASES["other"]["HOST"] = "direct.example"
    settings.BACKWAVE = {**settings.BACKWAVE, "HINT_DATABASES": {"default": "other"}}
    assert _hint_listener("default")._session._connect_params["host"] == "direct.example"
    settings.BACKWAVE = {key: value for key, value in settings.BACKWAVE.items() if key != "HINT_DATABASES"}
    assert _hint_listener("default")._session._connect_params.get("host") != "direct.example"

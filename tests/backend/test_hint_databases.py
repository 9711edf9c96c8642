"""BACKWAVE["HINT_DATABASES"]: the alias a worker's wake-up listener connects with (a direct
connection beside a transaction-pooling PgBouncer), validated where it is written."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import CommandError, call_command

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
    # The command says it as every configuration mistake it finds at start: a CommandError.
    with pytest.raises(CommandError, match="not an alias of DATABASES"):
        call_command("backwave_worker", "--queues", "e2e", "--until-idle")


def test_the_listener_connects_through_the_alias_named(settings):
    listening_on = lambda: _hint_listener("default")._session._connect_params["dbname"]  # noqa: E731
    assert listening_on() == settings.DATABASES["default"]["NAME"]
    settings.BACKWAVE = {**settings.BACKWAVE, "HINT_DATABASES": {"default": "other"}}
    assert listening_on() == settings.DATABASES["other"]["NAME"] != settings.DATABASES["default"]["NAME"]

"""backwave.conf: defaults, BACKWAVE values, backend OPTIONS overrides, clear errors."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from backwave import conf


def test_defaults_apply_when_backwave_does_not_set_them(settings):
    settings.BACKWAVE = {}
    assert conf.get_setting("MAX_PAYLOAD_BYTES") == 1024 * 1024
    assert conf.get_setting("MAX_RESULT_BYTES") == 1024 * 1024
    assert conf.get_setting("DEFAULT_MAX_ATTEMPTS") == 3
    assert conf.get_setting("DEFAULT_BACKOFF_BASE") == 1.0
    assert conf.get_setting("DEFAULT_BACKOFF_MAX") == 3600.0
    assert conf.get_setting("TASK_MODULES") == []
    assert conf.get_setting("WORKER_GROUPS") == []
    assert conf.get_setting("MAX_TRACEBACK_CHARS") == 16_000
    assert conf.get_setting("DATABASE") == "default"


def test_the_worker_is_durable_and_its_timeouts_follow_the_lease_by_default(settings):
    settings.BACKWAVE = {}
    assert conf.get_setting("WORKER_SYNCHRONOUS_COMMIT") is True
    assert conf.get_setting("WORKER_STATEMENT_TIMEOUT") is None
    assert conf.get_setting("WORKER_LOCK_TIMEOUT") is None


def test_missing_backwave_setting_means_defaults(settings):
    del settings.BACKWAVE
    assert conf.get_setting("DEFAULT_MAX_ATTEMPTS") == 3


def test_project_values_win_over_defaults(settings):
    settings.BACKWAVE = {"DEFAULT_MAX_ATTEMPTS": 7, "TASK_MODULES": ["shop.tasks"]}
    assert conf.get_setting("DEFAULT_MAX_ATTEMPTS") == 7
    assert conf.get_setting("TASK_MODULES") == ["shop.tasks"]


def test_project_worker_groups_are_exposed():
    groups = conf.get_setting("WORKER_GROUPS")
    assert groups[0]["name"] == "default"


def test_backend_options_win_over_project_values(settings):
    settings.BACKWAVE = {"MAX_PAYLOAD_BYTES": 100}
    assert conf.get_setting("MAX_PAYLOAD_BYTES", {"MAX_PAYLOAD_BYTES": 50}) == 50
    assert conf.get_setting("MAX_PAYLOAD_BYTES", {"DATABASE": "default"}) == 100
    assert conf.get_setting("DATABASE", {"DATABASE": "other"}) == "other"


def test_unknown_backwave_key_names_it_and_suggests(settings):
    settings.BACKWAVE = {"MAX_PAYLOD_BYTES": 10}
    with pytest.raises(ImproperlyConfigured) as excinfo:
        conf.get_setting("DEFAULT_MAX_ATTEMPTS")
    message = str(excinfo.value)
    assert "'MAX_PAYLOD_BYTES'" in message
    assert "Did you mean 'MAX_PAYLOAD_BYTES'?" in message
    assert "DEFAULT_MAX_ATTEMPTS" in message  # the allowed keys are listed


def test_backwave_must_be_a_dict(settings):
    settings.BACKWAVE = ["MAX_PAYLOAD_BYTES"]
    with pytest.raises(ImproperlyConfigured, match="must be a dict, got list"):
        conf.get_setting("MAX_PAYLOAD_BYTES")


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("DEFAULT_MAX_ATTEMPTS", 0, "an integer >= 1"),
        ("DEFAULT_MAX_ATTEMPTS", True, "an integer >= 1"),
        ("MAX_PAYLOAD_BYTES", "1MB", "an integer >= 1"),
        ("DEFAULT_BACKOFF_BASE", -1, "seconds >= 0"),
        ("DEFAULT_BACKOFF_MAX", float("inf"), "seconds >= 0"),
        ("DEFAULT_BACKOFF_MAX", 1e15, "at most 31,622,400 (a year)"),
        ("DEFAULT_BACKOFF_BASE", 1e15, "at most 31,622,400 (a year)"),
        ("OBSERVER_BACKOFF_MAX", 1e15, "at most 31,622,400 (a year)"),
        ("OBSERVER_BACKOFF_BASE", float("nan"), "seconds >= 0"),
        ("TASK_MODULES", "shop.tasks", "a list of dotted module paths"),
        ("WORKER_GROUPS", [("default",)], "a list of dicts"),
        ("MAX_TRACEBACK_CHARS", -1, "an integer >= 0"),
        ("WORKER_SYNCHRONOUS_COMMIT", "off", "True or False"),
        ("WORKER_STATEMENT_TIMEOUT", 0, "a finite number of seconds above 0, or None"),
        ("WORKER_STATEMENT_TIMEOUT", float("nan"), "a finite number of seconds above 0, or None"),
        ("WORKER_LOCK_TIMEOUT", -1.5, "a finite number of seconds above 0, or None"),
        ("WORKER_LOCK_TIMEOUT", float("inf"), "a finite number of seconds above 0, or None"),
        ("WORKER_LOCK_TIMEOUT", "2s", "a finite number of seconds above 0, or None"),
    ],
)
def test_bad_values_name_the_key_the_value_and_what_is_allowed(settings, name, value, allowed):
    settings.BACKWAVE = {name: value}
    with pytest.raises(ImproperlyConfigured) as excinfo:
        conf.get_setting(name)
    message = str(excinfo.value)
    assert f"BACKWAVE['{name}']" in message
    assert allowed in message
    assert repr(value) in message


def test_bad_backend_option_value_names_the_backend():
    with pytest.raises(
        ImproperlyConfigured, match=r"TASKS\['x'\]\['OPTIONS'\]\['MAX_PAYLOAD_BYTES'\] must be an integer >= 1, got 0"
    ):
        conf.get_setting("MAX_PAYLOAD_BYTES", {"MAX_PAYLOAD_BYTES": 0}, where="TASKS['x']['OPTIONS']")


def test_worker_only_settings_cannot_be_backend_options():
    with pytest.raises(ImproperlyConfigured, match="unknown key 'TASK_MODULES'"):
        conf.get_setting("TASK_MODULES", {"TASK_MODULES": []})


def test_asking_for_an_unknown_setting_is_an_error():
    with pytest.raises(ImproperlyConfigured, match="Did you mean 'MAX_PAYLOAD_BYTES'"):
        conf.get_setting("MAX_PAYLOAD_BYTE")


@pytest.mark.parametrize("value", [0, -1, 1.5, "1MiB", True])
def test_max_result_bytes_must_be_a_positive_integer(settings, value):
    settings.BACKWAVE = {"MAX_RESULT_BYTES": value}
    with pytest.raises(ImproperlyConfigured, match=r"BACKWAVE\['MAX_RESULT_BYTES'\] must be an integer >= 1"):
        conf.get_setting("MAX_RESULT_BYTES")

"""BACKWAVE["SCHEDULES"] and BACKWAVE["RETENTION"]: validated where they are read and by checks."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from backwave import conf
from backwave.checks import check_backwave_settings

NOOP = "tests.shell.worker_tasks.noop"


def test_defaults(settings):
    settings.BACKWAVE = {}
    assert conf.get_setting("SCHEDULES") == {}
    assert conf.retention() == {
        "succeeded": 86_400.0,
        "failed": 604_800.0,
        "cancelled": 604_800.0,
        "quarantined": 604_800.0,
        "pumps": 3_600.0,
        "task_stats_minutely": 172_800.0,
        "task_stats_hourly": 2_592_000.0,
    }


def test_retention_keys_left_out_keep_their_default(settings):
    settings.BACKWAVE = {"RETENTION": {"succeeded": 60, "quarantined": None}}
    assert conf.retention() == {
        "succeeded": 60,
        "failed": 604_800.0,
        "cancelled": 604_800.0,
        "quarantined": None,
        "pumps": 3_600.0,
        "task_stats_minutely": 172_800.0,
        "task_stats_hourly": 2_592_000.0,
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"succeded": 1},
            "BACKWAVE['RETENTION'] has an unknown key 'succeded'. Did you mean 'succeeded'? Allowed keys: cancelled, failed, pumps, quarantined, succeeded, task_stats_hourly, task_stats_minutely.",
        ),
        (
            {"failed": -5},
            "BACKWAVE['RETENTION']['failed'] must be a finite number of seconds >= 0 or None (keep for ever), got -5.",
        ),
        (
            [60],
            "BACKWAVE['RETENTION'] must be a dict with some of the keys succeeded, failed, cancelled, quarantined, pumps, task_stats_minutely, task_stats_hourly, got [60].",
        ),
    ],
)
def test_bad_retention_names_the_key_and_the_value(settings, value, message):
    settings.BACKWAVE = {"RETENTION": value}
    with pytest.raises(ImproperlyConfigured) as error:
        conf.retention()
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("schedules", "message"),
    [
        ({"n": {"task": NOOP}}, "BACKWAVE['SCHEDULES']['n'] needs 'cron'"),
        ({"n": {"cron": "* * * * *"}}, "BACKWAVE['SCHEDULES']['n'] needs 'task'"),
        ({"n": {"task": NOOP, "cron": "61 * * * *"}}, "['cron'] is not a valid cron expression"),
        (
            {"n": {"task": NOOP, "cron": "* * * *"}},
            "['cron'] has 4 fields; use 5 (minute hour day month weekday) or 6 (with seconds last), got '* * * *'.",
        ),
        ({"n": {"task": NOOP, "cron": "* * * * *", "every": 5}}, "BACKWAVE['SCHEDULES']['n'] has an unknown key 'every'."),
        ({"n": {"task": NOOP, "cron": "* * * * *", "args": "x"}}, "['args'] must be a list, got 'x'."),
        ({"n": {"task": NOOP, "cron": "* * * * *", "kwargs": [1]}}, "['kwargs'] must be a dict, got [1]."),
        (
            {"n": {"task": NOOP, "cron": "* * * * *", "priority": 500}},
            "['priority'] must be an integer from -100 to 100, got 500.",
        ),
        ({"n": {"task": NOOP, "cron": "* * * * *", "enabled": "yes"}}, "['enabled'] must be True or False, got 'yes'."),
        ({"n": {"task": NOOP, "cron": "* * * * *", "queue": "a queue"}}, "['queue'] must be 1 to 64 letters"),
        ({"": {"task": NOOP, "cron": "* * * * *"}}, "keys are schedule names (1 to 100 characters), got ''."),
        (["n"], "BACKWAVE['SCHEDULES'] must be a dict of schedules by name"),
    ],
)
def test_bad_schedules_are_refused_with_a_message_that_points_at_the_mistake(settings, schedules, message):
    settings.BACKWAVE = {"SCHEDULES": schedules}
    with pytest.raises(ImproperlyConfigured) as error:
        conf.get_setting("SCHEDULES")
    assert message in str(error.value)
    (check,) = check_backwave_settings()
    assert check.id == "backwave.E003" and message in check.msg


def test_good_schedules_pass(settings):
    # TASK_MODULES: the worker registers NOOP only from there, and the check asks what the worker would refuse.
    settings.BACKWAVE = {
        "TASK_MODULES": ["tests.shell.worker_tasks"],
        "SCHEDULES": {
            "s": {
                "task": NOOP,
                "cron": "*/5 * * * * 30",
                "args": [1],
                "kwargs": {"a": 1},
                "queue": "e2e",
                "priority": 3,
                "max_attempts": 2,
                "enabled": False,
            },
            "h": {"task": NOOP, "cron": "@hourly"},
        },
    }
    assert check_backwave_settings() == []


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ("tests.shell.worker_tasks.nothing_here", "cannot be imported"),
        ("tests.shell.worker_tasks.os", "is a module, not a task (decorate it with @task)"),
    ],
)
def test_a_schedule_must_name_a_task(settings, task, problem):
    settings.BACKWAVE = {"SCHEDULES": {"s": {"task": task, "cron": "* * * * *"}}}
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E005"
    assert f"BACKWAVE['SCHEDULES']['s'] names the task {task!r}, which {problem}" in error.msg

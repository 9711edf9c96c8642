"""One queue-name rule, applied wherever a queue name comes in: a task's definition and its
enqueue, the settings (TASKS QUEUES, BACKWAVE QUEUES, SCHEDULES, WORKER_GROUPS), the admin's
queue actions and ``manage.py backwave_queue``. A name with a trailing newline is the classic
miss (``re.match`` with ``$`` accepts it): it must be refused where it is written, not at claim."""

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTask

import backwave
from backwave.ops import actions as operations
from backwave.checks import check_backwave_settings
from backwave.core.options import WorkerGroupConfigError
from backwave.models import Job, Queue
from backwave.queue_rules import QUEUE_NAME_PATTERN, is_queue_name
from backwave.conf import group_from_mapping

from . import sample_tasks

BAD_NAMES = ["emails\n", "emails\r\n", "\nemails", "", "has space", "x" * 65, "ünïcode", "a/b"]


def any_queue(settings):
    """The default backend with no QUEUES list: Django's own membership check lets every name in."""
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}


# Moved from tests/core/test_options.py with the pattern itself (the core never used it).
@pytest.mark.parametrize("name", ["default", "emails.high", "a-b_c", "Q1", "x" * 64])
def test_queue_name_pattern_accepts(name):
    assert QUEUE_NAME_PATTERN.match(name)
    assert is_queue_name(name)


@pytest.mark.parametrize("name", ["", "has space", "ünïcode", "x" * 65, "a/b", "a\n"])
def test_queue_name_pattern_refuses(name):
    assert not QUEUE_NAME_PATTERN.match(name)


@pytest.mark.parametrize("name", [*BAD_NAMES, None, 7, b"emails"])
def test_the_rule_refuses(name):
    assert not is_queue_name(name)


@pytest.mark.django_db
def test_enqueue_refuses_a_trailing_newline_and_writes_nothing(settings):
    any_queue(settings)
    with pytest.raises(InvalidTask, match=r"queue_name of task '.*add' must be 1 to 64 letters.*got 'emails\\n'"):
        sample_tasks.add.using(queue_name="emails\n").enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many_refuses_it_before_writing_any_job(settings):
    any_queue(settings)
    with pytest.raises(InvalidTask, match="must be 1 to 64 letters"):
        backwave.enqueue_many([(sample_tasks.add, (1, 2), {}), (sample_tasks.add.using(queue_name="emails\n"), (3, 4), {})])
    assert not Job.objects.exists()


def test_a_task_cannot_be_defined_on_such_a_queue(settings):
    any_queue(settings)
    from django.tasks import task

    with pytest.raises(InvalidTask, match="must be 1 to 64 letters"):
        task(queue_name="emails\n")(sample_tasks.not_a_task)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_tasks_queues_setting_is_refused_by_the_system_check(settings, name):
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": ["default", name]}}
    assert [message.id for message in task_backends["default"].check()] == ["backwave.E103"]


@pytest.mark.parametrize(
    "value",
    [
        {"QUEUES": {"emails\n": {"paused": True}}},
        {"SCHEDULES": {"nightly": {"task": "tests.backend.sample_tasks.add", "cron": "0 3 * * *", "queue": "emails\n"}}},
    ],
    ids=["QUEUES", "SCHEDULES"],
)
def test_backwave_settings_refuse_it(settings, value):
    settings.BACKWAVE = value
    errors = check_backwave_settings()
    assert [error.id for error in errors] == ["backwave.E003"]
    assert "'emails\\n'" in errors[0].msg and "1 to 64 letters" in errors[0].msg


def test_a_worker_group_refuses_it():
    with pytest.raises(WorkerGroupConfigError, match=r"queue name 'emails\\n' is invalid"):
        group_from_mapping({"name": "default", "queues": ["default", "emails\n"]})


@pytest.mark.django_db
def test_queue_actions_and_the_command_refuse_it():
    with pytest.raises(ValueError, match="Invalid queue name 'emails\\\\n'"):
        operations.pause_queues(["emails\n"])
    with pytest.raises(CommandError, match="Invalid queue name 'emails\\\\n'"):
        call_command("backwave_queue", "limit", "emails\n", "3")
    assert not Queue.objects.exists()


def test_the_rule_is_written_once():
    """No other module of the package spells the pattern out again (migrations are history)."""
    package = Path(backwave.__file__).parent
    spelled = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "migrations" not in path.parts and "A-Za-z0-9_.-" in path.read_text(encoding="utf-8")
    )
    assert spelled == ["queue_rules.py"]
    assert QUEUE_NAME_PATTERN.pattern.endswith("\\Z")


@pytest.mark.parametrize(
    ("queues", "name"),
    [(["default"], "nowhere"), ([], "has space")],  # not in QUEUES; not a queue name at all
)
def test_queue_errors_carry_djangos_wording(settings, queues, name):
    # Code written against Django's backends matches its message ("Queue '...' is not valid for
    # backend."); BackWave's own explanation follows it.
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": queues}}
    with pytest.raises(InvalidTask, match=f"^Queue '{name}' is not valid for backend\\. .*task '.*add'"):
        sample_tasks.add.using(queue_name=name)

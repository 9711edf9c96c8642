"""Task validation: Django's options and BackWave's, at decoration, .using() or enqueue time."""

from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from backwave.backend import BackWaveBackend
from django.tasks import task
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

from backwave.models import Job
from backwave.tasking.task import BackWaveTask

from . import sample_tasks


def test_task_decorator_builds_a_backwave_task_with_its_options():
    assert isinstance(sample_tasks.charge, BackWaveTask)
    assert sample_tasks.charge.max_attempts == 5
    assert sample_tasks.charge.backoff_base == 2.0
    assert sample_tasks.charge.backoff_max == 60.0
    assert sample_tasks.charge.tags == ("billing", "nightly")  # a list becomes a tuple


def test_backwave_task_is_djangos_decorator_with_the_options_typed():
    """``backwave.task`` forwards to Django's ``@task``: the same task, with or without options,
    with or without parentheses, and a non-BackWave option refused as Django refuses it."""
    import backwave

    options = {"queue_name": "emails", "max_attempts": 5, "backoff_base": 2.0, "tags": ["billing"], "retry_on": ValueError}
    assert backwave.task(**options)(sample_tasks.undecorated) == task(**options)(sample_tasks.undecorated)
    assert backwave.task(sample_tasks.undecorated) == task(sample_tasks.undecorated)
    assert backwave.task(sample_tasks.undecorated).retry_on == ()
    assert backwave.task(**options)(sample_tasks.undecorated).retry_on == (ValueError,)
    with pytest.raises(TypeError, match="run_after cannot be defined statically"):
        backwave.task(run_after=timezone.now())(sample_tasks.undecorated)


def test_options_default_to_none_meaning_the_settings():
    assert sample_tasks.add.max_attempts is None
    assert sample_tasks.add.backoff_base is None
    assert sample_tasks.add.backoff_max is None
    assert sample_tasks.add.tags == ()


def test_using_accepts_django_and_backwave_options_and_keeps_the_rest():
    when = timezone.now() + timedelta(hours=1)
    changed = sample_tasks.charge.using(priority=-5, queue_name="reports", run_after=when, max_attempts=2, tags=("x",))
    assert (changed.priority, changed.queue_name, changed.run_after) == (-5, "reports", when)
    assert (changed.max_attempts, changed.tags) == (2, ("x",))
    assert (changed.backoff_base, changed.backoff_max) == (2.0, 60.0)
    assert changed.func is sample_tasks.charge.func
    assert sample_tasks.charge.priority == 0  # the original is untouched


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True])
def test_max_attempts_must_be_a_positive_integer_at_decoration(value):
    with pytest.raises(
        InvalidTask,
        match=rf"max_attempts of task 'tests.backend.sample_tasks.undecorated' must be an integer >= 1.*got {value!r}",
    ):
        task(max_attempts=value)(sample_tasks.undecorated)


def test_max_attempts_is_checked_by_using_too():
    with pytest.raises(InvalidTask, match="max_attempts .* got 0"):
        sample_tasks.add.using(max_attempts=0)


@pytest.mark.parametrize("name", ["backoff_base", "backoff_max"])
@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), "1s"])
def test_backoff_values_must_be_seconds(name, value):
    with pytest.raises(InvalidTask, match=rf"{name} of task .* must be a finite number of seconds >= 0"):
        sample_tasks.add.using(**{name: value})


@pytest.mark.parametrize("name", ["backoff_base", "backoff_max"])
def test_backoff_values_past_the_maximum_delay_are_refused_at_definition(name):
    """A retry delay has a ceiling (a year): past it a retry could never be written as one."""
    from backwave.core.backoff import MAX_DELAY

    assert getattr(sample_tasks.add.using(backoff_base=1.0, backoff_max=MAX_DELAY), "backoff_max") == MAX_DELAY
    with pytest.raises(
        InvalidTask, match=rf"{name} of task .* must be a finite number of seconds >= 0 and at most 31,622,400 \(a year\)"
    ):
        sample_tasks.add.using(**{name: 1e15})


def test_a_backoff_cap_below_the_base_is_refused_at_definition():
    with pytest.raises(InvalidTask) as caught:
        sample_tasks.add.using(backoff_base=2.0, backoff_max=0.5)
    assert str(caught.value) == (
        "backoff_max of task 'tests.backend.sample_tasks.add' (0.5 s) must be at least its backoff_base (2 s): "
        "it caps every retry's delay, the first one included."
    )


def test_a_backoff_cap_below_the_default_base_is_refused_too(settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "DEFAULT_BACKOFF_BASE": 10.0}
    with pytest.raises(
        InvalidTask, match=r"backoff_max of task .* \(5 s\) must be at least its backoff_base \(10 s, DEFAULT_BACKOFF_BASE\)"
    ):
        sample_tasks.add.using(backoff_max=5.0)
    with pytest.raises(
        InvalidTask, match=r"backoff_max of task .* \(3600 s, DEFAULT_BACKOFF_MAX\) must be at least its backoff_base \(7200 s\)"
    ):
        sample_tasks.add.using(backoff_base=7200.0)


@pytest.mark.django_db
def test_an_enqueue_under_a_default_backoff_cap_below_its_base_writes_nothing(settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "DEFAULT_BACKOFF_BASE": 10.0, "DEFAULT_BACKOFF_MAX": 5.0}
    with pytest.raises(
        ImproperlyConfigured,
        match=r"BACKWAVE\['DEFAULT_BACKOFF_MAX'\] \(5 s\) must be at least BACKWAVE\['DEFAULT_BACKOFF_BASE'\] \(10 s\)",
    ):
        sample_tasks.add.enqueue(1, 2)
    assert not Job.objects.exists()


def test_a_backoff_cap_equal_to_the_base_is_allowed():
    assert sample_tasks.add.using(backoff_base=2.0, backoff_max=2.0).backoff_max == 2.0


def test_zero_backoff_is_allowed():
    assert sample_tasks.add.using(backoff_base=0, backoff_max=0).backoff_base == 0


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ("email", r"must be a list or tuple of strings, got 'email'; did you mean \('email',\)\?"),
        (("",), "must be a string of 1 to 64 characters"),
        (("x" * 65,), "must be a string of 1 to 64 characters"),
        ((1,), "must be a string of 1 to 64 characters without a NUL or a lone surrogate, got 1"),
        (tuple(f"t{i}" for i in range(17)), "has 17 tags; at most 16"),
    ],
)
def test_tags_must_be_a_few_short_strings(tags, message):
    with pytest.raises(InvalidTask, match=message):
        sample_tasks.add.using(tags=tags)


@pytest.mark.django_db
@pytest.mark.parametrize("tag", ["a\x00b", "caf\udce9"])
def test_a_tag_text_cannot_hold_is_refused_at_definition_and_the_transaction_stays_usable(tag):
    """A lone surrogate passed the NUL check and failed the INSERT (DataError, the caller's
    transaction aborted)."""
    from django.db import transaction

    from backwave.models import Job

    with transaction.atomic():
        with pytest.raises(
            InvalidTask, match="each tag of task .* must be a string of 1 to 64 characters without a NUL or a lone surrogate"
        ):
            sample_tasks.add.using(tags=("ok", tag)).enqueue(1, 2)
        assert not Job.objects.exists()


@pytest.mark.parametrize("priority", [101, -101, 1.5, "5", None.__class__])
def test_bad_priority_raises_naming_the_value(priority):
    with pytest.raises(InvalidTask, match=r"priority must be a whole number between -100 and 100\. Task .* has priority"):
        sample_tasks.add.using(priority=priority)


def test_whole_float_priority_is_accepted_like_django_does():
    assert sample_tasks.add.using(priority=5.0).priority == 5.0


def test_unknown_queue_names_the_queues_and_suggests():
    with pytest.raises(
        InvalidTask, match=r"Queue 'emial' is not valid for backend\. .* QUEUES \[.*'emails'.*\]\. Did you mean 'emails'\?"
    ):
        sample_tasks.add.using(queue_name="emial")


def test_queue_name_shape_is_checked():
    with pytest.raises(InvalidTask, match="must be 1 to 64 letters, digits"):
        sample_tasks.add.using(queue_name="no spaces")


def test_run_after_must_be_an_aware_datetime():
    with pytest.raises(
        InvalidTask, match=r"run_after .* must be a datetime, got datetime.timedelta.*timezone.now\(\) \+ timedelta"
    ):
        sample_tasks.add.using(run_after=timedelta(minutes=5))
    with pytest.raises(InvalidTask, match="aware"):
        sample_tasks.add.using(run_after=datetime(2030, 1, 1))


def test_async_functions_are_accepted():
    assert BackWaveBackend.supports_async_task
    assert task(sample_tasks.async_function).func is sample_tasks.async_function


def test_takes_context_needs_a_first_argument_named_context():
    assert sample_tasks.with_context.takes_context
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(sample_tasks.needs_context_but_has_none)


def test_functions_must_be_module_level():
    def local(a):
        return a

    with pytest.raises(InvalidTask, match="module level"):
        task(local)


def test_run_after_cannot_be_set_at_decoration():
    with pytest.raises(TypeError, match="run_after"):
        task(run_after=timezone.now())(sample_tasks.undecorated)


def test_unknown_decorator_option_is_a_type_error():
    with pytest.raises(TypeError, match="max_attempt"):
        task(max_attempt=3)(sample_tasks.undecorated)


def test_backwave_tasks_pickle_with_their_options():
    import pickle

    copy = pickle.loads(pickle.dumps(sample_tasks.charge.using(max_attempts=2)))
    assert copy == sample_tasks.charge.using(max_attempts=2)
    assert copy.func is sample_tasks.charge.func


def test_nested_functions_get_a_clear_message():
    import functools

    with pytest.raises(InvalidTask, match="must be defined at a module level"):
        task(functools.partial(sample_tasks.undecorated, 1))

"""@observe: what it accepts, what it refuses (at import, with a message naming the mistake), and
which transitions a registry asks the store to note."""

from __future__ import annotations

import json

import pytest

from backwave.observers import Observer, ObserverRegistry, Transition, observe
from tests.testing import observing


def handler(transition):
    return transition.kind


def test_an_observer_is_named_by_its_path_and_still_callable():
    observer = observe("succeeded")(handler)
    assert isinstance(observer, Observer)
    assert observer.name == "tests.backend.test_observe.handler"
    assert (
        observer(Transition(id=1, job_id=2, attempt=1, kind="succeeded", task_path="t", queue="q", occurred_at=None))
        == "succeeded"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: observe(), "needs at least one transition kind"),
        (lambda: observe("succeded"), "unknown transition kind 'succeded'.*Did you mean 'succeeded'"),
        (lambda: observe("failed", tasks="app.tasks.send"), "tasks must be a list.*did you mean \\['app.tasks.send'\\]"),
        (lambda: observe("failed", tasks=[42]), "each of tasks must be a Task"),
        (lambda: observe("failed", queues=["no spaces allowed"]), "each of queues must be"),
        (lambda: observe("failed", queues=[]), "would match nothing"),
        (lambda: observe("failed")(lambda t: None), "module-level function"),
    ],
)
def test_mistakes_are_refused_where_they_are_made(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_registry_matches_by_kind_task_and_queue_and_calls_in_name_order():
    registry = ObserverRegistry([observing.watch, observing.flaky_observer, observing.enqueues_a_follow_up])
    transition = Transition(
        id=1, job_id=1, attempt=2, kind="succeeded", task_path=observing.fails_once.module_path, queue="e2e", occurred_at=None
    )
    assert [o.name.rsplit(".", 1)[1] for o in registry.matching(transition)] == ["flaky_observer", "watch"]
    retried = Transition(
        id=2, job_id=1, attempt=1, kind="retried", task_path=observing.fails_once.module_path, queue="e2e", occurred_at=None
    )
    assert [o.name.rsplit(".", 1)[1] for o in registry.matching(retried)] == ["watch"]


def test_the_store_is_asked_to_note_exactly_the_watched_transitions():
    registry = ObserverRegistry([observing.flaky_observer, observe("lapsed", queues=["emails"])(handler)])
    assert sorted(json.loads(registry.observed), key=str) == sorted(
        [
            # Each watch names its observer: a transition is noted for the observers that watch it.
            {
                "kind": "succeeded",
                "task_path": observing.fails_once.module_path,
                "queue": None,
                "observer": observing.flaky_observer.name,
            },
            {"kind": "lapsed", "task_path": None, "queue": "emails", "observer": f"{__name__}.handler"},
        ],
        key=str,
    )
    assert ObserverRegistry().observed == "[]"


def test_the_delivery_settings_are_checked_naming_the_setting(settings):
    from django.core.exceptions import ImproperlyConfigured

    from backwave import conf

    assert conf.delivery_options().max_deliveries == 8
    settings.BACKWAVE = {"OBSERVER_BACKOFF_BASE": 10.0, "OBSERVER_BACKOFF_MAX": 1.0}
    with pytest.raises(ImproperlyConfigured, match=r"OBSERVER_BACKOFF_MAX \(1.0\) must be at least OBSERVER_BACKOFF_BASE"):
        conf.delivery_options()
    settings.BACKWAVE = {"OBSERVER_LEASE": 0}
    with pytest.raises(ImproperlyConfigured, match="OBSERVER_LEASE"):
        conf.delivery_options()
    settings.BACKWAVE = {"OBSERVER_MAX_DELIVERIES": 0}
    assert any("OBSERVER_MAX_DELIVERIES" in problem for problem in conf.settings_problems())

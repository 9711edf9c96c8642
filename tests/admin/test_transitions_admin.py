"""The Transitions page: dead deliveries first, retried or discarded by an operator; and the
admin's cancel noting a 'cancelled' transition for the observers that watch it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from backwave.ops import actions
from backwave.models import Job, Transition
from backwave.observers import ObserverRegistry, observe

from .conftest import make_job

pytestmark = pytest.mark.django_db

TRANSITIONS = reverse("admin:backwave_transition_changelist")


def on_cancel(transition):
    """An observer of cancellations, for the cancel test's registry."""


def make_transition(**fields) -> Transition:
    fields.setdefault("job_id", 1)
    fields.setdefault("attempt", 1)
    fields.setdefault("kind", "failed")
    fields.setdefault("task_path", "project.demo.tasks.fast_job")
    fields.setdefault("queue", "default")
    return Transition.objects.create(**fields)


def test_dead_transitions_come_first_with_the_observer_and_its_error(admin_client):
    make_transition(job_id=7)
    make_transition(
        job_id=8,
        state="dead",
        deliveries=8,
        failed_observer="shop.observers.page_on_call",
        last_error="Traceback ...\nConnectionError: pager down",
    )
    content = admin_client.get(TRANSITIONS).content.decode()
    assert content.index("shop.observers.page_on_call") < content.index(reverse("admin:backwave_job_change", args=[7]))
    assert "ConnectionError: pager down" in content and ">dead<" in content


def test_a_cancel_of_a_job_that_never_ran_shows_no_attempt_number(admin_client):
    """A dependent cancelled because its ancestor failed (or a job cancelled before any worker
    took it) is noted with attempt 0, the job's attempts so far: the page says it never ran
    rather than show an attempt 0 that no job page has."""
    make_transition(job_id=7, attempt=0, kind="cancelled")
    make_transition(job_id=8, attempt=2, kind="failed")
    content = admin_client.get(TRANSITIONS).content.decode()
    assert content.count("never ran") == 1
    assert '<td class="field-attempt_shown">2</td>' in content


def test_retry_makes_dead_ones_due_with_a_full_set_of_tries_and_discard_deletes_them(operator_client):
    dead = make_transition(state="dead", deliveries=8, delivered_to=["a.ran"], failed_observer="a.fails")
    response = operator_client.post(TRANSITIONS, {"action": "redeliver", "_selected_action": [dead.pk], "index": 0}, follow=True)
    assert "1 transition due for delivery now." in [str(m) for m in response.context["messages"]]
    dead.refresh_from_db()
    assert (dead.state, dead.deliveries, dead.delivered_to) == ("pending", 0, ["a.ran"])  # a.ran is not run again

    again = make_transition(state="dead")
    pending = make_transition()
    operator_client.post(TRANSITIONS, {"action": "discard", "_selected_action": [again.pk, pending.pk], "index": 0})
    assert set(Transition.objects.values_list("pk", flat=True)) == {dead.pk, pending.pk}


def test_a_waiting_delivery_names_its_observers_and_says_when_no_live_worker_has_one(admin_client):
    """A rolling deploy: the newer release's observer waits for a worker that has it registered."""
    from datetime import timedelta

    from django.utils import timezone

    from backwave.models import Deliverer

    waiting = make_transition(job_id=7, kind="succeeded", observers=["shop.kept", "shop.added"], delivered_to=["shop.kept"])
    Deliverer.objects.create(id="old:1:default", hostname="old", pid=1, observers=["shop.kept"])
    # A worker that had it, silent for an hour: no live worker.
    Deliverer.objects.create(
        id="new:2:default",
        hostname="new",
        pid=2,
        observers=["shop.added", "shop.kept"],
        seen_at=timezone.now() - timedelta(hours=1),
    )
    content = admin_client.get(TRANSITIONS).content.decode()
    assert "shop.added" in content and "no live worker has this observer registered" in content
    assert content.count("no live worker has this observer registered") == 1  # shop.kept ran: not waited for
    page = admin_client.get(reverse("admin:backwave_transition_change", args=[waiting.pk])).content.decode()
    assert "no live worker has this observer registered" in page

    # Discard takes a row that waits only for observers no live worker has, and leaves the rest.
    on_its_way = make_transition(job_id=8, kind="succeeded", observers=["shop.kept"])
    operator_client = admin_client
    operator_client.post(TRANSITIONS, {"action": "discard", "_selected_action": [waiting.pk, on_its_way.pk], "index": 0})
    assert list(Transition.objects.values_list("pk", flat=True)) == [on_its_way.pk]
    waiting = make_transition(job_id=7, kind="succeeded", observers=["shop.kept", "shop.added"], delivered_to=["shop.kept"])

    Deliverer.objects.filter(id="new:2:default").update(seen_at=timezone.now())  # the newer release is up
    content = admin_client.get(TRANSITIONS).content.decode()
    assert "shop.added" in content and "no live worker has this observer registered" not in content
    operator_client.post(TRANSITIONS, {"action": "discard", "_selected_action": [waiting.pk], "index": 0})
    assert Transition.objects.filter(pk=waiting.pk).exists()  # on its way now


def test_a_viewer_cannot_retry(readonly_client):
    dead = make_transition(state="dead")
    response = readonly_client.post(TRANSITIONS, {"action": "redeliver", "_selected_action": [dead.pk], "index": 0})
    assert response.status_code == 403
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_the_admins_cancel_notes_a_cancelled_transition_when_it_is_watched(monkeypatch):
    watched, unwatched = make_job(), make_job()
    assert actions.cancel_job_ids([watched.pk]).changed == (watched.pk,)
    assert not Transition.objects.exists()  # nobody observes cancellations (the default registry)

    registry = ObserverRegistry([observe("cancelled", tasks=[watched.task_path])(on_cancel)])
    monkeypatch.setattr(actions, "discovered_observers", lambda: registry)
    other = make_job(task_path="somewhere.else")
    result = actions.cancel_job_ids([unwatched.pk, other.pk])
    assert set(result.changed) == {unwatched.pk, other.pk}
    assert list(Transition.objects.values_list("job_id", "kind", "task_path")) == [
        (unwatched.pk, "cancelled", unwatched.task_path)
    ]
    assert Job.objects.get(pk=other.pk).state == "cancelled"
    # A retry notes nothing.
    actions.retry_job_ids([unwatched.pk])
    assert Transition.objects.count() == 1

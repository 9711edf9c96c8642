"""Admission under the deterministic test pump: a rate window passes with advance(), and the
per-key limit holds as it does for a worker."""

from __future__ import annotations

import pytest

from backwave.models import Job
from backwave.testing import DeterministicPump

from . import tasks


@pytest.fixture
def limited(settings, db):
    settings.BACKWAVE = {
        **settings.BACKWAVE,
        "QUEUES": {"default": {"rate_limit": 3, "rate_period": 60}, "emails": {"key_concurrency_limit": 1}},
    }


def test_a_rate_limited_queue_runs_one_window_per_advance(limited):
    for n in range(7):
        tasks.add.enqueue(n, 1)
    with DeterministicPump(tasks=[tasks], queues=["default"]) as pump:
        assert pump.drain().succeeded == 3
        assert pump.drain().succeeded == 0  # the window is used up: nothing runs until it passes
        pump.advance(60)
        assert pump.drain().succeeded == 3
        pump.advance(60)
        assert pump.drain().succeeded == 1
    assert Job.objects.filter(state="succeeded").count() == 7


def test_the_per_key_limit_holds_under_the_test_pump(limited):
    for customer in ["a", "a", "a", "b", "b"]:
        tasks.running_beside.enqueue(customer)
    with DeterministicPump(tasks=[tasks], queues=["emails"], max_claim_batch=8) as pump:
        drained = pump.drain()
    assert drained.succeeded == 5
    assert set(Job.objects.values_list("return_value", flat=True)) == {1}

"""Whatever a task hands back costs that job alone: a return value PostgreSQL cannot store, or an
exception whose text no column can hold, fails (or is cleaned for) that one attempt, while its
batch-mates succeed and the pump stays healthy. A real Pump against the real PostgreSQL."""

from __future__ import annotations

import time

import pytest

from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Attempt, Job
from backwave.models import Pump as PumpRow
from backwave.shell.pump import HEALTHY, Pump
from backwave.tasking.registry import TaskRegistry
from backwave.store.postgres import PostgresStore
from backwave.store.storable import ERROR_CLASS_MAX_CHARS
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = TaskRegistry([worker_tasks.noop, worker_tasks.returns_unstorable, worker_tasks.raises_strange_text])

# What each attempt's stored text must say: what was wrong, and where.
REASONS = {
    "nan": "the return value holds NaN at ['rows'][3]",
    "inf": "the return value holds Infinity at [0]",
    "nul": "the return value holds a NUL character at ['name']",
    "surrogate": "the return value holds a lone surrogate (U+DCE9) at ['files'][0]",
    "huge_int": "the return value is an int of 5,000 digits",
    "set": "the return value is a set, which is not JSON-serialisable",
    "too_big": "the return value is 2.0 MiB of JSON, over BACKWAVE['MAX_RESULT_BYTES'] (1.0 MiB)",
}


def _wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _run_pump(expected_finished: int) -> Pump:
    """One pump with room for the whole batch: one claim, one outcome write. Stopped by a drain
    once ``expected_finished`` jobs are finished (or the pump died trying)."""
    options = WorkerGroupOptions(
        name="unstorable",
        policy=Strict("e2e"),
        pool_size=32,
        max_claim_batch=32,
        poll_interval=0.05,
        maintenance_interval=3600,
        lease_duration=600,
    )
    pump = Pump(options, 0, store_factory=PostgresStore.from_django, registry=REGISTRY)
    pump.start()
    try:
        _wait_until(lambda: not pump.alive or Job.objects.exclude(state__in=["ready", "running"]).count() >= expected_finished)
        health = PumpRow.objects.filter(worker_id=pump.worker_id).values_list("status", "reason").first()
    finally:
        pump.drain(timeout=5)
        assert pump.join(10)
    assert pump.health == HEALTHY, pump.health_reason
    assert health == (HEALTHY, "")
    return pump


def _attempt(result) -> Attempt:
    (attempt,) = Attempt.objects.filter(job_id=result.id)
    return attempt


def test_each_unstorable_return_value_fails_its_own_job_and_its_batch_mates_succeed():
    kinds = list(worker_tasks.UNSTORABLE_RESULTS)
    calls = []
    for kind in kinds:  # each bad value between two good jobs, all in one batch
        calls += [(worker_tasks.noop, (1,), {}), (worker_tasks.returns_unstorable, (kind,), {})]
    calls.append((worker_tasks.noop, (2,), {}))
    results = enqueue_many(calls)

    _run_pump(expected_finished=len(results))

    bad = dict(zip(kinds, results[1::2]))
    good = results[0::2]
    assert [Job.objects.get(id=r.id).state for r in good] == ["succeeded"] * len(good)
    for kind, result in bad.items():
        job = Job.objects.get(id=result.id)
        attempt = _attempt(result)
        # A type JSON has not fails as Django's backends record it, a TypeError; the rest are BackWave's.
        error_class = "builtins.TypeError" if kind == "set" else "backwave.UnstorableResult"
        assert (kind, job.state, job.return_value, attempt.error_class) == (kind, "failed", None, error_class)
        assert REASONS[kind] in attempt.traceback, (kind, attempt.traceback[-400:])
        final = worker_tasks.returns_unstorable.get_result(result.id)
        assert [e.exception_class_path for e in final.errors] == [error_class]


@pytest.mark.parametrize("kind", ["surrogate", "nul", "long_class"])
def test_an_exception_whose_text_no_column_holds_is_stored_cleaned(kind):
    before, strange, after = enqueue_many(
        [(worker_tasks.noop, (1,), {}), (worker_tasks.raises_strange_text, (kind,), {}), (worker_tasks.noop, (2,), {})]
    )

    _run_pump(expected_finished=3)

    assert [Job.objects.get(id=r.id).state for r in (before, strange, after)] == ["succeeded", "failed", "succeeded"]
    attempt = _attempt(strange)
    assert "\x00" not in attempt.traceback and "\x00" not in attempt.error_class
    assert not any("\ud800" <= c <= "\udfff" for c in attempt.traceback + attempt.error_class)
    assert len(attempt.error_class) <= ERROR_CLASS_MAX_CHARS == Attempt._meta.get_field("error_class").max_length
    if kind == "surrogate":
        assert attempt.error_class == "builtins.FileNotFoundError"
        assert "no such file: /data/caf\\udce9.csv" in attempt.traceback  # shown, escaped
    elif kind == "nul":
        assert "bad byte \\x00 in the input" in attempt.traceback
    else:
        assert attempt.error_class.endswith("E" * 50)  # the class's own name is what is kept
        assert "an exception class whose name is longer than the error_class column" in attempt.traceback


def test_a_traceback_is_cut_to_max_traceback_chars_marker_included():
    (result,) = enqueue_many([(worker_tasks.raises_strange_text, ("nul",), {})])
    options = WorkerGroupOptions(
        name="cut", policy=Strict("e2e"), pool_size=2, poll_interval=0.05, maintenance_interval=3600, lease_duration=600
    )
    pump = Pump(options, 0, store_factory=PostgresStore.from_django, registry=REGISTRY, max_traceback_chars=200)
    pump.start()
    try:
        assert _wait_until(lambda: Job.objects.get(id=result.id).state == "failed")
    finally:
        pump.drain(timeout=5)
        assert pump.join(10)
    traceback = _attempt(result).traceback
    assert len(traceback) == 200
    assert traceback.startswith("…(truncated)\n")
    assert traceback.endswith("ValueError: bad byte \\x00 in the input\n")  # the end is kept, the NUL shown escaped

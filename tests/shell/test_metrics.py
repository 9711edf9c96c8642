"""The worker's Prometheus metrics: ``/metrics`` on its health server, read back with
prometheus_client's own parser, against a real worker and the real PostgreSQL."""

from __future__ import annotations

import sys
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backwave.core.jobs import OutcomeKind
from backwave.core.options import WorkerGroupOptions
from backwave.core.policy import Strict
from backwave.models import Job
from backwave.shell.metrics import DURATION_BUCKETS, PumpTally
from backwave.shell.worker import Worker
from backwave.store.postgres import PostgresStore
from backwave.tasking.registry import TaskRegistry
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks
from tests.shell.conftest import wait_until


def scrape(port: int, accept: str | None = None) -> tuple[str, str, dict]:
    """(content type, body, {sample name: {labels tuple: value}}) of one scrape."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        content_type, body = response.headers["Content-Type"], response.read().decode()
    samples: dict[str, dict] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return content_type, body, samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture
def running_worker():
    """A Worker on a thread with its health endpoint on a free port; drained at the end."""
    started = []

    def start(*, tasks=(), **options) -> Worker:
        options = {"pool_size": 4, "poll_interval": 0.05, "maintenance_interval": 3600, **options}
        group = WorkerGroupOptions(name="metrics", policy=Strict("e2e"), database="default", **options)
        registry = TaskRegistry([worker_tasks.noop, worker_tasks.always_fails, worker_tasks.flaky, *tasks])
        worker = Worker([group], store_factory=PostgresStore.from_django, registry=registry, health_port=0)
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, name="worker-main")
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.drain(timeout=5)
        thread.join(30)


@pytest.mark.django_db(transaction=True)
def test_the_worker_endpoint_counts_outcomes_durations_and_pumps(running_worker):
    enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(30)])
    enqueue_many([(worker_tasks.always_fails, (), {}) for _ in range(3)])  # max_attempts 2: a retry, then failed
    enqueue_many([(worker_tasks.flaky, (), {"succeed_on": 2})])  # a retry, then succeeded
    worker = running_worker()
    port = worker.health_server.port
    done = {"succeeded", "failed"}
    wait_until(lambda: Job.objects.exclude(state__in=done).count() == 0, "every job finished", timeout=60)
    # The pump publishes its tally when it is about to wait: wait for the last outcome to show.
    wait_until(lambda: sum(sum(p.tally_snapshot.finished.values()) for p in worker.pumps) == 38, "the tally published")

    content_type, body, samples = scrape(port)
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    common = {"database": "default", "queue": "e2e"}
    noop, fails, flaky = (f"tests.shell.worker_tasks.{name}" for name in ("noop", "always_fails", "flaky"))
    assert value(samples, "backwave_jobs_finished_total", **common, task=noop, outcome="succeeded") == 30
    assert value(samples, "backwave_jobs_finished_total", **common, task=fails, outcome="retry") == 3
    assert value(samples, "backwave_jobs_finished_total", **common, task=fails, outcome="failed") == 3
    assert value(samples, "backwave_jobs_finished_total", **common, task=flaky, outcome="retry") == 1
    assert value(samples, "backwave_jobs_finished_total", **common, task=flaky, outcome="succeeded") == 1

    assert value(samples, "backwave_job_duration_seconds_count", **common, task=noop) == 30
    assert value(samples, "backwave_job_duration_seconds_bucket", **common, task=noop, le="+Inf") == 30
    assert 0 < value(samples, "backwave_job_duration_seconds_sum", **common, task=noop) < 30
    buckets = [value(samples, "backwave_job_duration_seconds_bucket", **common, task=noop, le=str(b)) for b in DURATION_BUCKETS]
    assert buckets == sorted(buckets), "cumulative buckets"

    pumps = {"database": "default", "group": "metrics"}
    assert value(samples, "backwave_worker_pumps", **pumps, status="healthy") == 1
    assert value(samples, "backwave_worker_pumps", **pumps, status="degraded") == 0
    assert value(samples, "backwave_worker_pumps", **pumps, status="halted") == 0
    assert value(samples, "backwave_worker_pumps_stalled", **pumps) == 0
    assert value(samples, "backwave_jobs_running", **pumps) == 0
    assert value(samples, "backwave_jobs_claimed_ahead", **pumps) == 0
    assert value(samples, "backwave_leases_lost_total", **pumps) == 0
    assert value(samples, "backwave_store_round_trips_total", **pumps) >= 1
    assert value(samples, "backwave_lease_expired_jobs_total", database="default") == 0
    # The process-wide default registry follows: the process and Python collectors.
    assert "python_info" in samples
    assert "# TYPE backwave_jobs_finished_total counter" in body and "# TYPE backwave_job_duration_seconds histogram" in body

    # The health JSON is still served everywhere else.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
        assert response.headers["Content-Type"] == "application/json"


@pytest.mark.django_db(transaction=True)
def test_atomic_successes_and_snoozes_are_counted_with_their_durations(running_worker):
    """An atomic task's success is written by its attempt, not by the pump's batched write: it
    is counted all the same, as is a snooze and the attempt after it."""
    enqueue_many([(worker_tasks.noop, (i,), {}) for i in range(20)] + [(worker_tasks.atomic_noop, (i,), {}) for i in range(20)])
    worker_tasks.snoozes_once.enqueue()
    worker = running_worker(tasks=[worker_tasks.atomic_noop, worker_tasks.snoozes_once])
    wait_until(lambda: Job.objects.filter(state="succeeded").count() == 41, "every job succeeded", timeout=60)
    published = lambda: sum(sum(p.tally_snapshot.finished.values()) for p in worker.pumps)  # noqa: E731
    try:
        wait_until(lambda: published() >= 42, "the tally published", timeout=10)
    except AssertionError:
        pass  # the scrape below says which outcomes are missing

    _, _, samples = scrape(worker.health_server.port)
    common = {"database": "default", "queue": "e2e"}
    noop, atomic, snoozes = (f"tests.shell.worker_tasks.{name}" for name in ("noop", "atomic_noop", "snoozes_once"))
    assert value(samples, "backwave_jobs_finished_total", **common, task=noop, outcome="succeeded") == 20
    assert value(samples, "backwave_jobs_finished_total", **common, task=atomic, outcome="succeeded") == 20
    assert value(samples, "backwave_job_duration_seconds_count", **common, task=atomic) == 20
    assert value(samples, "backwave_jobs_finished_total", **common, task=snoozes, outcome="snoozed") == 1
    assert value(samples, "backwave_jobs_finished_total", **common, task=snoozes, outcome="succeeded") == 1
    total = sum(count for labels, count in samples["backwave_jobs_finished_total"].items())
    assert total == 42


@pytest.mark.django_db(transaction=True)
def test_the_worker_endpoint_speaks_openmetrics_when_asked(running_worker):
    worker = running_worker()
    content_type, body, _ = scrape(worker.health_server.port, accept="application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text"), content_type
    assert body.rstrip().endswith("# EOF")
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    names = {family.name for family in openmetrics_families(body)}
    assert {"backwave_jobs_finished", "backwave_worker_pumps", "backwave_lease_expired_jobs"} <= names


@pytest.mark.django_db(transaction=True)
def test_lease_expiries_by_this_workers_maintenance_are_counted(running_worker):
    from tests.factories import JobFactory, make_lease

    lease = make_lease("gone:1:g:0:dead", -5)  # a dead worker's lease, lapsed 5 s ago
    JobFactory.create_batch(3, state="running", lease_id=lease.id, queue="elsewhere", attempts=1)
    worker = running_worker(maintenance_interval=0.05)
    wait_until(lambda: not Job.objects.filter(state="running").exists(), "maintenance expiring the lapsed lease")
    wait_until(lambda: sum(p.tally_snapshot.lease_expired_jobs for p in worker.pumps) == 3, "the expiry counted")
    _, _, samples = scrape(worker.health_server.port)
    assert value(samples, "backwave_lease_expired_jobs_total", database="default") == 3


def test_counting_an_outcome_takes_no_lock():
    """The pump thread counts each applied outcome: plain dict arithmetic, never a lock (a
    prometheus_client Counter.inc or Histogram.observe would take one per job)."""
    tally = PumpTally()
    acquired = []

    def profile(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") in {"acquire", "__enter__", "acquire_lock"}:
            acquired.append(arg)

    sys.setprofile(profile)
    try:
        for i in range(500):
            tally.applied("q", "t", OutcomeKind.SUCCEEDED if i % 2 else OutcomeKind.RETRY, i / 1000)
        tally.expired(2)
        tally.lost_lease()
    finally:
        sys.setprofile(None)
    assert acquired == []
    published = tally.publish()
    assert published.finished == {("q", "t", "succeeded"): 250, ("q", "t", "retry"): 250}
    counts, seconds = published.durations[("q", "t")]
    assert sum(counts) == 500 and seconds == pytest.approx(sum(i / 1000 for i in range(500)))
    assert counts[0] == 6  # 0.000 to 0.005 s: a bucket holds its upper bound
    assert tally.publish() is published, "nothing changed: the same snapshot, no copy"


def test_a_quarantined_job_is_counted_but_has_no_duration():
    tally = PumpTally()
    tally.applied("q", "gone.task", OutcomeKind.QUARANTINED, 0.0)
    published = tally.publish()
    assert published.finished == {("q", "gone.task", "quarantined"): 1}
    assert published.durations == {}

"""Admission across real worker processes: a per-key limit and a rate limit hold cluster-wide.

Counts, never timings: the per-key limit is checked on samples of the running rows (the peak
per key), the rate limit on the rows' own start times (database clock) per aligned window.
"""

from __future__ import annotations

import json
import math
import signal
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Count, Max, Min

from backwave.models import Attempt, Job, Lease, Queue
from backwave.tasking.task import enqueue_many
from tests.shell import worker_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = ("--poll-interval", "0.05", "--maintenance-interval", "0.5", "--log-every", "5")


def test_a_per_key_limit_of_two_holds_across_three_worker_processes(start_worker):
    customers = [f"customer-{n}" for n in range(5)]
    workers = [start_worker("--queues", "keyed", "--pool-size", "8", *FAST) for _ in range(3)]
    # Every worker claiming before the jobs exist: enqueued first, the 40 jobs (under a second of
    # work) could all go to the one worker that happened to start first (seen on a CI run).
    workers[0].wait_for(lambda: Lease.objects.count() == 3, what="the three workers polling", timeout=60)
    enqueue_many([(worker_tasks.per_customer, (customer, 0.15), {}) for _ in range(8) for customer in customers])
    peak: Counter[str] = Counter()
    samples = 0
    while Job.objects.filter(queue="keyed").exclude(state="succeeded").exists():
        running = Job.objects.filter(queue="keyed", state="running").values("limit_key").annotate(n=Count("id"))
        for row in running:
            peak[row["limit_key"]] = max(peak[row["limit_key"]], row["n"])
        samples += 1
        for worker in workers:
            assert worker.process.poll() is None, worker.output
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output
    assert samples > 20, "the run was sampled too rarely to say anything"
    assert max(peak.values()) <= 2, peak
    assert max(peak.values()) == 2, f"the limit was never reached, so it was not tested: {peak}"
    assert Queue.objects.get(name="keyed").key_concurrency_limit == 2  # written by the workers at start
    # No key waited for another to drain: every key started before the first key was done.
    spans = Job.objects.filter(queue="keyed").values("limit_key").annotate(first=Min("started_at"), last=Max("finished_at"))
    first_done = min(span["last"] for span in spans)
    assert all(span["first"] < first_done for span in spans), list(spans)
    # Several worker processes really shared the work.
    assert len({":".join(worker_id.split(":")[:2]) for worker_id in Job.objects.values_list("worker_id", flat=True)}) >= 2


def test_a_rate_limit_of_fifty_a_second_holds_across_two_workers(start_worker):
    total = 650
    enqueue_many([(worker_tasks.rated_noop, (n,), {}) for n in range(total)])
    workers = [start_worker("--queues", "rated", "--pool-size", "10", *FAST) for _ in range(2)]
    workers[0].wait_for(
        lambda: Job.objects.filter(queue="rated", state="succeeded").count() == total, timeout=60, what="every rated job done"
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output
    with connection.cursor() as cursor:
        cursor.execute("SELECT floor(extract(epoch FROM started_at))::bigint FROM backwave_job WHERE queue = 'rated'")
        windows = Counter(row[0] for row in cursor.fetchall())
    assert max(windows.values()) <= 50, sorted(windows.items())  # exact in every aligned window
    first = min(windows)
    ten_seconds = sum(windows[first + n] for n in range(1, 11))  # the ten full windows after the first
    assert 450 <= ten_seconds <= 550, sorted(windows.items())
    assert (
        len(
            {
                ":".join(worker_id.split(":")[:2])
                for worker_id in Job.objects.filter(queue="rated").values_list("worker_id", flat=True)
            }
        )
        == 2
    )
    assert math.isclose(Queue.objects.get(name="rated").rate_period, 1.0)


@pytest.mark.parametrize(
    "task",
    [worker_tasks.overruns_under_a_key.using(limit_key="acme"), worker_tasks.overruns_in_a_queue],
    ids=["per-key", "queue"],
)
def test_a_handler_past_its_time_limit_counts_against_the_limit_until_it_returns(start_worker, tmp_path, task):
    """Each first attempt runs a second past its 0.2 s time limit, never looking at should_stop:
    the worker records it failed and the job is ready again while its handler still runs. That
    handler still counts against the limit of one (the key's, the queue's) until it returns, so
    no two handlers ever run at once, however free the pool's threads are."""
    tally = tmp_path / "tally.json"
    results = enqueue_many([(task, (str(tally),), {}) for _ in range(3)])
    worker = start_worker("--queues", task.queue_name, "--pool-size", "4", *FAST)
    ids = [result.id for result in results]

    def tally_read():
        return json.loads(tally.read_text() or "{}") if tally.exists() else {}

    worker.wait_for(
        lambda: Job.objects.filter(id__in=ids, state="succeeded").count() == 3 and tally_read().get("running") == 0,
        timeout=60,
        what="every job's retry succeeding and every handler returning",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    timed_out = Attempt.objects.filter(job_id__in=ids, error_class="backwave.TimeLimitExceeded").count()
    assert timed_out == 3, "every first attempt ran past its limit, so each one overran its attempt"
    seen = tally_read()
    assert seen["started"] == 6, seen  # three overrunning first attempts, three retries
    assert seen["peak"] == 1, f"{seen['peak']} handlers ran at once under a limit of one: {seen}"

"""The demo's tasks: one per kind of job the home page can enqueue."""

import time

from django.tasks import task

SLOW_JOB_MAX_SECONDS = 5


@task
def fast_job(n):
    """Return at once: the throughput case."""
    return n * 2


@task
def slow_job(seconds):
    """Hold a worker slot for a while (capped, so a typo cannot park a worker for an hour)."""
    seconds = min(max(float(seconds), 0.0), SLOW_JOB_MAX_SECONDS)
    time.sleep(seconds)
    return seconds


@task(max_attempts=3, backoff_base=0.5)
def failing_job(message):
    """Always fail: shows retries with backoff, then a dead job with every attempt's error."""
    raise RuntimeError(message)


@task(queue_name="reports")
def report_job():
    """Stand-in for a report rendered on its own queue."""
    return {"rows": 42}


@task(queue_name="emails")
def email_job():
    """Stand-in for an email sent on its own queue."""
    return "sent"


@task(queue_name="bench")
def noop(n):
    """Does nothing: what bench/throughput.py drains to measure the engine itself."""
    return n


# bench/atomic.py: the same database work, plain and effect-once. The table is the benchmark's
# own (it creates it), one row per job.
BENCH_EFFECTS = "bench_effect"


def _write_effect(n):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {BENCH_EFFECTS} (n) VALUES (%s)", [n])
    return n


@task(queue_name="bench")
def write_effect(n):
    """One INSERT that commits on its own (autocommit), its outcome written later in a batch."""
    return _write_effect(n)


@task(queue_name="bench", atomic=True)
def write_effect_atomically(n):
    """The same INSERT, committed with its fenced outcome in one transaction (effect-once)."""
    return _write_effect(n)


@task(queue_name="bench", atomic=True)
def noop_atomically(n):
    """noop as an atomic task: what the transaction and the per-job outcome statement cost alone."""
    return n


@task(queue_name="bench")
def orm_probe(n):
    """One query through the ORM, then the id of the PostgreSQL session that answered it:
    bench/orm_jobs.py counts from these how many sessions a worker's threads opened."""
    from django.db import connection

    from backwave.models import Queue

    Queue.objects.filter(name="bench").exists()
    return connection.connection.info.backend_pid


@task(queue_name="bench")
def sql_probe(n):
    """The same question as orm_probe, as one SELECT through ``django.db.connection`` (the
    workload issue 13 measured its reconnects with): no QuerySet to build and compile."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM backwave_queue WHERE name = %s)", ["bench"])
        cursor.fetchone()
    return connection.connection.info.backend_pid

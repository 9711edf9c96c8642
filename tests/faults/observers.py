"""Observers of the observer tests, discovered in fault worker subprocesses only (the tests.faults
app is installed there alone). Each records what it saw in SEEN (created by the tests)."""

import os
from pathlib import Path

from django.db import connection

from backwave.observers import observe

SEEN = "backwave_test_seen"
# A file path: the first delivery that finds no file there creates it and kills the process,
# after recording what it saw and before its pass is settled (a crash mid-delivery).
CRASH_ONCE = "BACKWAVE_TEST_CRASH_OBSERVER_ONCE"


@observe(
    "succeeded", "failed", "retried", "lapsed", tasks=["tests.faults.tasks.observed_work", "tests.faults.tasks.atomic_effect"]
)
def record_transition(transition):
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {SEEN} (transition_id, job_id, attempt, kind, delivery, pid) VALUES (%s, %s, %s, %s, %s, %s)",
            [transition.id, transition.job_id, transition.attempt, transition.kind, transition.delivery, os.getpid()],
        )
    marker = os.environ.get(CRASH_ONCE)
    if marker and not Path(marker).exists():
        Path(marker).touch()
        os._exit(9)

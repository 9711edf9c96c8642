"""The observers of the rolling-deploy test (tests/faults/test_rolling_observers.py), in two
modules as two releases of one project have them: ``kept`` is in both, ``added`` only in the
newer one (tests/faults/deploy_observers_added.py). Each records who saw what in SEEN_BY (created
by the test)."""

import os

from django.db import connection

from backwave.observers import observe

SEEN_BY = "backwave_test_seen_by"
TASK = "tests.faults.tasks.work"


def record(observer: str, transition) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {SEEN_BY} (observer, transition_id, job_id, kind, pid) VALUES (%s, %s, %s, %s, %s)",
            [observer, transition.id, transition.job_id, transition.kind, os.getpid()],
        )


@observe("succeeded", tasks=[TASK])
def kept(transition):
    record("kept", transition)

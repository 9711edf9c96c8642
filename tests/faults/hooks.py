"""Test-only fault injection for worker subprocesses, switched on by BACKWAVE_TEST_FAULTS.

The fault tests start the real ``manage.py backwave_worker``; ``tests/settings.py`` calls
``settings_for()`` when the variable holds a JSON object, and the ``tests.faults`` app installs
the patches once the app registry is ready. Keys:

* ``clock_skew``: seconds added to the process's wall clock (``time.time`` and Django's
  ``timezone.now``), never to ``time.monotonic``, which the pump uses for its own timers.
* ``trust_lease_for_ever``: switch the driver's self-fence off, so a stalled pump writes its
  outcomes late and the store's lease fence alone must refuse them.
* ``no_heartbeat``: the pump never renews its lease (a blocked heartbeat).
* ``halt_on_task``: a pump that claims a first attempt of this task feeds its driver an event
  the driver must refuse (an outcome write that was never sent): an invariant violation.
* ``worker_groups`` / ``schedules`` / ``queues``: BACKWAVE['WORKER_GROUPS'] / ['SCHEDULES'] / ['QUEUES'].
* ``backwave``: any other BACKWAVE settings (e.g. ``{"OBSERVER_POLL_INTERVAL": 0.05}``).
* ``modules_at_first_claim``: a file path; the process's first claim writes there (as a JSON
  list) the names of the modules loaded by then, before it is sent.

The app also brings ``tests/faults/observers.py``, the observers of the observer tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

ENV = "BACKWAVE_TEST_FAULTS"


def faults() -> dict:
    return json.loads(os.environ.get(ENV) or "{}")


def settings_for(backwave: dict) -> dict:
    """BACKWAVE with the faults' settings applied; the clock is skewed at once (before Django)."""
    spec = faults()
    if spec.get("clock_skew"):
        _skew_clock(float(spec["clock_skew"]))
    backwave = dict(backwave)
    if "worker_groups" in spec:
        backwave["WORKER_GROUPS"] = spec["worker_groups"]
    if "schedules" in spec:
        backwave["SCHEDULES"] = spec["schedules"]
    if "queues" in spec:
        backwave["QUEUES"] = spec["queues"]
    backwave.update(spec.get("backwave", {}))
    return backwave


def install() -> None:
    """Patch the engine's classes (called from the app's ready())."""
    spec = faults()
    if spec.get("clock_skew"):
        from django.utils import timezone

        real_now = timezone.now
        skew = float(spec["clock_skew"])
        timezone.now = lambda: real_now() + __import__("datetime").timedelta(seconds=skew)
    if spec.get("trust_lease_for_ever"):
        from backwave.core.driver import NodeDriver

        def trust_for_ever(self, sent_at):
            self._lease_trusted_until = float("inf")

        NodeDriver._trust_lease_from = trust_for_ever
    if spec.get("no_heartbeat"):
        from backwave.core.driver import NodeDriver

        original_init = NodeDriver.__init__

        def init(self, options):
            original_init(self, dataclasses.replace(options, heartbeat_interval=1e9))

        NodeDriver.__init__ = init
    if spec.get("halt_on_task"):
        _halt_on(spec["halt_on_task"])
    if spec.get("modules_at_first_claim"):
        _record_modules_at_first_claim(spec["modules_at_first_claim"])


def _skew_clock(seconds: float) -> None:
    real_time = time.time
    time.time = lambda: real_time() + seconds


def _halt_on(task_path: str) -> None:
    from backwave.core import events as ev
    from backwave.core.driver import InvalidEvent, NodeDriver

    original = NodeDriver.handle

    def handle(self, event):
        if isinstance(event, ev.ClaimReturned) and any(j.task_path == task_path and j.attempt == 1 for j in event.jobs):
            # The real driver must refuse this: no write of these ids was ever sent.
            original(self, ev.OutcomesWritten(now=event.now, applied=frozenset(j.id for j in event.jobs)))
            raise InvalidEvent(event, self.state, "the fault hook expected the driver to refuse")  # pragma: no cover
        return original(self, event)

    NodeDriver.handle = handle


def _record_modules_at_first_claim(path: str) -> None:
    from backwave.store.postgres import PostgresStore

    original = PostgresStore.claim_jobs

    def claim_jobs(self, **kwargs):
        if not os.path.exists(path):
            with open(path, "w") as out:
                json.dump(sorted(sys.modules), out)
        return original(self, **kwargs)

    PostgresStore.claim_jobs = claim_jobs

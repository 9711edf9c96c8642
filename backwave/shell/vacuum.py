"""The job table's cleanup: one thread per worker process and served database.

Each claim leaves a dead entry at the front of the claim index (``backwave.store.vacuum``), and
the claims after it walk them until the table is vacuumed. The cleaner reads the table's counters
every ``check_every`` seconds, on a session of its own, and vacuums once the row versions changed
outside HOT since the last vacuum (its own or anyone's: autovacuum, another worker) reach
``after``, or ``fraction`` of the table's rows when that is more. A vacuum's cost grows with the
table, so the threshold does too: the vacuuming per job stays about the same however large the
table, and the walk a claim pays for stays within a few hundred pages. With the default 20,000 on
a 2-core machine: a 1,000,000-row table vacuumed in about 0.1 s after each 20,000 changes (some 10,000 jobs: a claim and
an outcome each), against up to 500 pages walked per claim after a 100,000-job drain without it.

Nothing here is needed for correctness. A lost session is logged and opened again after a backoff;
should the thread end all the same, claims only walk more pages until autovacuum comes.
``BACKWAVE["VACUUM_JOB_TABLE_AFTER"] = None`` leaves the table to autovacuum alone.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from backwave.store.contract import StoreError
from backwave.store.vacuum import JobTableVacuum, TableChanges

logger = logging.getLogger("backwave.maintenance")

# The share of the table's rows that must change before a vacuum, when that is more than `after`.
TABLE_FRACTION = 0.02


@dataclass(frozen=True, slots=True)
class Baseline:
    """The counters of the last vacuum the cleaner knows of (or of its first reading)."""

    changed: int
    vacuums: int


def baseline_stands(now: TableChanges, baseline: Baseline) -> bool:
    """Whether ``now`` still counts from ``baseline``. Someone else's vacuum (a new vacuum count)
    or counters reset (fewer changes than before) mean nothing is owed: counting starts anew."""
    return now.vacuums == baseline.vacuums and now.changed >= baseline.changed


def vacuum_due(now: TableChanges, baseline: Baseline, *, after: int, fraction: float = TABLE_FRACTION) -> bool:
    """Whether enough changed since ``baseline`` for the cleaner to vacuum."""
    return baseline_stands(now, baseline) and now.changed - baseline.changed >= max(after, fraction * now.rows)


class JobTableCleaner:
    """A daemon thread vacuuming the job table of one database (see the module's docstring)."""

    def __init__(
        self, session: JobTableVacuum, *, after: int, check_every: float = 1.0, max_backoff: float = 30.0, name: str = "default"
    ):
        if after < 1:
            raise ValueError("after must be at least 1 changed row")
        self._session = session
        self._after = after
        self._check_every = check_every
        self._max_backoff = max_backoff
        self._baseline: Baseline | None = None
        self._stop = threading.Event()
        self._random = random.Random()
        self.vacuums = 0  # vacuums this cleaner ran
        self._thread = threading.Thread(target=self._run, name=f"backwave-vacuum-{name}", daemon=True)

    def step(self) -> bool:
        """Read the counters once and vacuum if due; whether it vacuumed. Store errors propagate."""
        now = self._session.changes()
        if now is None:
            return False  # no job table yet
        if self._baseline is None or not baseline_stands(now, self._baseline):
            self._baseline = Baseline(changed=now.changed, vacuums=now.vacuums)
            return False
        if not vacuum_due(now, self._baseline, after=self._after):
            return False
        self._session.vacuum()
        self.vacuums += 1
        # The counters after it: what changed while it ran is owed to the next one. A vacuum
        # skipped (another session held the table) counts as done: that session is cleaning it.
        after = self._session.changes() or now
        self._baseline = Baseline(changed=after.changed, vacuums=after.vacuums)
        return True

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._session.cancel()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=5)
        else:
            self._session.close()

    def _run(self) -> None:
        backoff = self._check_every
        try:
            while not self._stop.wait(self._check_every):
                try:
                    self.step()
                    backoff = self._check_every
                except StoreError as error:
                    if self._stop.is_set():
                        break
                    self._session.close()
                    delay = backoff * (0.5 + self._random.random() / 2)
                    logger.warning("Job table cleanup: %s; trying again in %.1fs", error, delay)
                    self._stop.wait(delay)
                    backoff = min(backoff * 2, self._max_backoff)
        except BaseException:  # logged, never silent: claims then walk more until autovacuum comes
            logger.exception("The job table cleanup thread ended; claims walk dead index entries until the table is vacuumed")
        finally:
            self._session.close()

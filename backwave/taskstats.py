"""Per-task statistics: the duration histogram maintenance keeps, and what pages read back from it.

The rollup (``roll_up_task_stats`` in store/queries.sql, mirrored by the InMemoryStore) folds each
finished attempt into a bucket per task and time: counts by outcome and a histogram of durations.
Percentiles of any range are read back from the summed histograms, so no page ever sorts the
attempts themselves. A bin is a quarter of an octave wide (each bound 2^(1/4), about 19 %, above
the one before), from 0.1 ms up to about a day: a percentile read back is within 10 % of the
exact one (the bin's geometric middle, never above the range's maximum).

No Django and no database here: the stores and the admin share these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

BIN_BASE = 0.0001  # seconds: bin 0 holds everything shorter
BINS_PER_OCTAVE = 4
MAX_BIN = 120  # 0.1 ms x 2^(119/4) is about 13 hours; longer attempts share the last bin
RESOLUTIONS = (60, 3600)  # the bucket widths kept, in seconds
OUTCOMES = ("succeeded", "retried", "failed", "quarantined", "lapsed", "cancelled", "snoozed")
# What the statement needs of this module, as its parameters.
SQL_PARAMS = {"bin_base": BIN_BASE, "bins_per_octave": BINS_PER_OCTAVE, "max_bin": MAX_BIN}


def bin_of(duration: float) -> int:
    """The histogram bin of a duration in seconds (the statement computes the same)."""
    if duration < BIN_BASE:
        return 0
    return min(MAX_BIN, math.floor(BINS_PER_OCTAVE * math.log(duration / BIN_BASE) / math.log(2)) + 1)


def bin_bounds(index: int) -> tuple[float, float]:
    """[low, high) seconds of a bin; bin 0 starts at 0, the last has no upper bound."""
    if index <= 0:
        return 0.0, BIN_BASE
    low = BIN_BASE * 2 ** ((index - 1) / BINS_PER_OCTAVE)
    high = math.inf if index >= MAX_BIN else BIN_BASE * 2 ** (index / BINS_PER_OCTAVE)
    return low, high


def merge_histograms(histograms: Iterable[Mapping]) -> dict[int, int]:
    """The sum of sparse histograms ({bin: count}, keys as stored: text or int)."""
    total: dict[int, int] = {}
    for histogram in histograms:
        for key, count in (histogram or {}).items():
            total[int(key)] = total.get(int(key), 0) + int(count)
    return total


def percentile(histogram: Mapping[int, int], fraction: float, maximum: float | None = None) -> float | None:
    """The duration below which ``fraction`` of the attempts fell, read from the histogram: the
    geometric middle of the bin holding it (capped by ``maximum``). None without attempts."""
    count = sum(histogram.values())
    if not count:
        return None
    rank = max(1, math.ceil(fraction * count))
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            low, high = bin_bounds(index)
            if index <= 0:
                middle = low if maximum is None else min(maximum, BIN_BASE / 2)
            elif math.isinf(high):
                middle = low if maximum is None else max(low, maximum)
            else:
                middle = math.sqrt(low * high)
            return middle if maximum is None else min(middle, maximum)
    return maximum


@dataclass
class TaskSummary:
    """One task's attempts over a range: what the statistics page shows per line."""

    task_path: str
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    quarantined: int = 0
    lapsed: int = 0
    cancelled: int = 0
    snoozed: int = 0  # asked to run later: neither a success nor a failure
    reruns: int = 0
    timed: int = 0
    duration_sum: float = 0.0
    duration_max: float = 0.0
    histogram: dict[int, int] = field(default_factory=dict)

    @property
    def attempts(self) -> int:
        return self.succeeded + self.retried + self.failed + self.quarantined + self.lapsed + self.cancelled + self.snoozed

    @property
    def failing(self) -> int:
        """Attempts that failed (retried, failed, quarantined or lapsed); a cancel or a snooze is no failure."""
        return self.retried + self.failed + self.quarantined + self.lapsed

    @property
    def failure_rate(self) -> float | None:
        return self.failing / self.attempts if self.attempts else None

    @property
    def mean(self) -> float | None:
        return self.duration_sum / self.timed if self.timed else None

    @property
    def p50(self) -> float | None:
        return percentile(self.histogram, 0.50, self.duration_max)

    @property
    def p95(self) -> float | None:
        return percentile(self.histogram, 0.95, self.duration_max)

    def add(
        self,
        *,
        succeeded=0,
        retried=0,
        failed=0,
        quarantined=0,
        lapsed=0,
        cancelled=0,
        snoozed=0,
        reruns=0,
        timed=0,
        duration_sum=0.0,
        duration_max=0.0,
        histogram=None,
    ) -> None:
        """Fold in one bucket's numbers."""
        self.succeeded += succeeded
        self.retried += retried
        self.failed += failed
        self.quarantined += quarantined
        self.lapsed += lapsed
        self.cancelled += cancelled
        self.snoozed += snoozed
        self.reruns += reruns
        self.timed += timed
        self.duration_sum += duration_sum
        self.duration_max = max(self.duration_max, duration_max)
        self.histogram = merge_histograms([self.histogram, histogram or {}])

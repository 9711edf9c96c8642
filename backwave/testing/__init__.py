"""Testing with BackWave: a deterministic pump for your tests, and the simulator for BackWave's own.

For your tests (Django needed; see the README, "Testing your tasks")::

    from backwave.testing import DeterministicPump, assert_enqueued, refute_enqueued, capture_enqueued

and the pytest fixtures ``backwave_pump`` and ``backwave_jobs`` (``backwave.testing.pytest_plugin``).

For BackWave itself: ``python -m backwave.testing.simulation --seeds 1000`` (no Django needed).

Names are imported on first use, so the simulator and the pytest plugin load without Django.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DeterministicPump": "pump",
    "DrainResult": "pump",
    "PumpStuck": "pump",
    "VirtualClock": "clock",
    "DjangoConnectionStore": "store",
    "EnqueuedJob": "assertions",
    "JobAssertions": "assertions",
    "all_enqueued": "assertions",
    "assert_enqueued": "assertions",
    "refute_enqueued": "assertions",
    "capture_enqueued": "assertions",
}

# Written out, not computed: type checkers and linters read a literal list only.
__all__ = [
    "DeterministicPump",
    "DjangoConnectionStore",
    "DrainResult",
    "EnqueuedJob",
    "JobAssertions",
    "PumpStuck",
    "VirtualClock",
    "all_enqueued",
    "assert_enqueued",
    "capture_enqueued",
    "refute_enqueued",
]

# What type checkers and editors read instead of __getattr__ (tests/test_public_api.py holds
# these equal to _EXPORTS).
if TYPE_CHECKING:
    from .assertions import EnqueuedJob, JobAssertions, all_enqueued, assert_enqueued, capture_enqueued, refute_enqueued
    from .clock import VirtualClock
    from .pump import DeterministicPump, DrainResult, PumpStuck
    from .store import DjangoConnectionStore


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'backwave.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

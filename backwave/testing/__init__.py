"""Testing with BackWave: a deterministic pump for your tests, and the simulator for BackWave's own.

For your tests (Django needed; see the README, "Testing your tasks")::

    from backwave.testing import DeterministicPump, assert_enqueued, refute_enqueued, capture_enqueued

and the pytest fixtures ``backwave_pump`` and ``backwave_jobs`` (``backwave.testing.pytest_plugin``).

For BackWave itself: ``python -m backwave.testing.simulation --seeds 1000`` (no Django needed).

Names are imported on first use, so the simulator and the pytest plugin load without Django.
"""

from __future__ import annotations

import importlib

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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'backwave.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

"""Testing with BackWave.

``DjangoConnectionStore`` runs the Storage Contract on Django's own connection, on a
``VirtualClock``: the store of the deterministic test pump.

Names are imported on first use, so importing this package needs no Django.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "VirtualClock": "clock",
    "DjangoConnectionStore": "store",
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

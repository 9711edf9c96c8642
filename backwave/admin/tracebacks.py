"""Moved to ``backwave.ops.tracebacks``; this path keeps working for one release (it is the same module)."""

import importlib
import sys
import warnings

warnings.warn(
    "backwave.admin.tracebacks moved to backwave.ops.tracebacks; import it from there", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = importlib.import_module("backwave.ops.tracebacks")

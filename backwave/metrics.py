"""Moved to ``backwave.ops.metrics``; this path keeps working for one release (it is the same module)."""

import importlib
import sys
import warnings

warnings.warn("backwave.metrics moved to backwave.ops.metrics; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("backwave.ops.metrics")

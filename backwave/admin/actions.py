"""Moved to ``backwave.ops.actions``; this path keeps working for one release (it is the same module)."""

import importlib
import sys
import warnings

warnings.warn("backwave.admin.actions moved to backwave.ops.actions; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("backwave.ops.actions")

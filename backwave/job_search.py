"""Moved to ``backwave.ops.search``; this path keeps working for one release (it is the same module)."""

import importlib
import sys
import warnings

warnings.warn("backwave.job_search moved to backwave.ops.search; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("backwave.ops.search")

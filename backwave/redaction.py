"""Moved to ``backwave.ops.redaction``; this path keeps working for one release (it is the same module)."""

import importlib
import sys
import warnings

warnings.warn("backwave.redaction moved to backwave.ops.redaction; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("backwave.ops.redaction")

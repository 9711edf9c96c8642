"""The path in the ``error_class`` of attempt rows: "backwave.results.LeaseLapsed".

The store writes that name into every attempt a lapsed lease ended, and rows outlive releases,
so the name keeps resolving to the class (defined in ``backwave/tasking/results.py``).
"""

from backwave.tasking.results import AttemptFailed, LeaseLapsed

__all__ = ["AttemptFailed", "LeaseLapsed"]

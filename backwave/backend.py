"""The path settings name: ``TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend"}}``.

The backend lives in ``backwave/tasking/backend.py``; this path stays for the projects that name it.
"""

from backwave.tasking.backend import BackWaveBackend

__all__ = ["BackWaveBackend"]

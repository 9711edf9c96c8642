"""Settings for bench/admission.py: the project's, plus the queues and tasks it measures."""

from project.settings import *  # noqa: F401,F403
from project.settings import BACKWAVE, TASKS

TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], "bench-keyed"]}}
BACKWAVE = {
    **BACKWAVE,
    "TASK_MODULES": [*BACKWAVE.get("TASK_MODULES", []), "bench.admission_tasks"],
    # One running job per key: with 100 keys and a pool of 16 the limit binds on every claim
    # that meets a key already running, so the per-key path is measured, not skipped.
    "QUEUES": {**BACKWAVE.get("QUEUES", {}), "bench-keyed": {"key_concurrency_limit": 1}},
}

"""The task registry: the only way a worker turns a wire name into code.

At start-up the worker imports each installed app's ``tasks`` module and the modules named in
``BACKWAVE["TASK_MODULES"]``, and records every ``django.tasks.Task`` it finds there under its
wire name (``task.module_path``). A job row's ``task_path`` is then looked up in that table and
nothing else: a row can never make the worker import a module of its choosing.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Iterable, Mapping

from django.apps import apps
from django.tasks import Task

logger = logging.getLogger("backwave.registry")


class TaskRegistry(Mapping):
    """Wire name -> Task, frozen after discovery."""

    def __init__(self, tasks: Iterable[Task] = ()):
        self._tasks: dict[str, Task] = {}
        self._senders: dict[str, type] = {}
        for task in tasks:
            self._tasks[task.module_path] = task

    def sender(self, task: Task) -> type:
        """The backend class a task's signals are sent from (looked up once per task)."""
        sender = self._senders.get(task.module_path)
        if sender is None:
            sender = self._senders[task.module_path] = type(task.get_backend())
        return sender

    def __getitem__(self, wire_name: str) -> Task:
        return self._tasks[wire_name]

    def __iter__(self):
        return iter(self._tasks)

    def __len__(self):
        return len(self._tasks)

    @classmethod
    def discover(cls, extra_modules: Iterable[str] = ()) -> TaskRegistry:
        """Import every app's ``tasks`` module plus ``extra_modules`` and collect their tasks."""
        module_names = []
        for app_config in apps.get_app_configs():
            candidate = f"{app_config.name}.tasks"
            if importlib.util.find_spec(app_config.name) and _module_exists(candidate):
                module_names.append(candidate)
        module_names.extend(extra_modules)
        found: list[Task] = []
        for name in dict.fromkeys(module_names):
            module = importlib.import_module(name)
            found.extend(value for value in vars(module).values() if isinstance(value, Task))
        registry = cls(found)
        logger.info("Discovered %d task(s) in %d module(s)", len(registry), len(module_names))
        return registry


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False

"""System checks for BackWave's project-wide settings, with stable ids.

backwave.E001  settings.BACKWAVE is not a dict
backwave.E002  settings.BACKWAVE has an unknown key (the message suggests the closest one)
backwave.E003  a BACKWAVE value has the wrong kind (the message says what is allowed)
backwave.E004  a TASK_MODULES entry names no importable module
backwave.E005  a SCHEDULES entry names a task that cannot be imported as a django.tasks Task
backwave.E006  a worker could not start on WORKER_GROUPS (an unknown option, an interval out of
               range, a heartbeat past the self-fence, a database that is not a PostgreSQL
               alias of DATABASES) or on WORKER_STATEMENT_TIMEOUT / WORKER_LOCK_TIMEOUT against
               the groups' leases (the message is the worker's own)
backwave.E007  a worker could not start on a SCHEDULES entry: its task is not registered (not in
               an installed app's tasks.py nor TASK_MODULES), or its backend refuses the job it
               would mint (an undeclared queue, arguments that are not JSON...)
backwave.W001  a BackWave backend enqueues into a database that no worker group serves
backwave.W002  a queue a BackWave backend declares is served by no worker group on that
               backend's database (only with WORKER_GROUPS set: a plain worker serves them all)

Each TASKS backend checks its own configuration (ids backwave.E1xx, ``backwave/tasking/backend.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from . import conf

# Every BackWave check carries this tag (``manage.py check --tag backwave``), so the worker can
# run its own checks at start without the project's template and URL checks (see backwave_worker).
TAG = "backwave"


@checks.register(TAG)
def check_backwave_settings(app_configs=None, **kwargs):
    """Check ``settings.BACKWAVE``: known keys, values of the right kind, findable task modules."""
    user = getattr(settings, "BACKWAVE", {})
    if not isinstance(user, Mapping):
        return [checks.Error(f"settings.BACKWAVE must be a dict, got {type(user).__name__}.", id="backwave.E001")]
    errors = []
    for key in user:
        if key not in conf.DEFAULTS:
            errors.append(checks.Error(conf.unknown_key_message(key, conf.DEFAULTS, "settings.BACKWAVE"), id="backwave.E002"))
    malformed = set()
    for name, value in user.items():
        if name in conf.DEFAULTS and (problem := conf.value_problem(name, value, "BACKWAVE")):
            errors.append(checks.Error(problem, id="backwave.E003"))
            malformed.add(name)
    if problem := conf.default_backoff_problem():
        errors.append(checks.Error(problem, id="backwave.E003"))
    if not malformed & {"WORKER_GROUPS", "WORKER_STATEMENT_TIMEOUT", "WORKER_LOCK_TIMEOUT"} and (
        problem := _worker_problem(user)
    ):
        errors.append(
            checks.Error(
                problem,
                hint="The worker refuses to start on these settings; `manage.py backwave_worker` says the same.",
                id="backwave.E006",
            )
        )
    modules = user.get("TASK_MODULES", [])
    if not conf.value_problem("TASK_MODULES", modules, "BACKWAVE"):
        for module in modules:
            if not _module_exists(module):
                errors.append(
                    checks.Error(
                        f"BACKWAVE['TASK_MODULES'] names {module!r}, which is not an importable module.",
                        hint="Use the dotted path of a module that defines tasks, e.g. 'shop.tasks'.",
                        id="backwave.E004",
                    )
                )
    schedules = user.get("SCHEDULES", {})
    if not conf.value_problem("SCHEDULES", schedules, "BACKWAVE"):
        importable = {}
        for name, spec in schedules.items():
            if problem := _task_problem(spec["task"]):
                errors.append(
                    checks.Error(
                        f"BACKWAVE['SCHEDULES'][{name!r}] names the task {spec['task']!r}, which {problem}.",
                        hint="Use the wire name of a function decorated with @task: its module path and name, e.g. 'shop.tasks.report'.",
                        id="backwave.E005",
                    )
                )
            else:
                importable[name] = spec
        if importable and not any(error.id == "backwave.E004" for error in errors):
            errors.extend(_schedule_errors(importable))
    return errors


def _schedule_errors(schedules: Mapping) -> list[checks.Error]:
    """What the worker would refuse of these schedules at start (backwave.E007): a task it does
    not register, or a job its task's backend would not enqueue (an undeclared queue...)."""
    from backwave.tasking.registry import TaskRegistry

    try:
        registry = TaskRegistry.discover(conf.get_setting("TASK_MODULES"))
    except Exception:  # a tasks module that fails to import: the worker (and E004) report it
        return []
    errors = []
    for name, spec in schedules.items():
        try:
            conf.definitions_from_settings({name: spec}, registry)
        except conf.ScheduleConfigError as error:
            errors.append(
                checks.Error(
                    str(error),
                    hint="The worker refuses to start on this schedule; `manage.py backwave_worker` says the same.",
                    id="backwave.E007",
                )
            )
    return errors


def _worker_problem(user: Mapping) -> str | None:
    """Why a worker started on these settings (without flags) would refuse to run, or None."""
    from backwave.core.options import WorkerGroupConfigError, store_timeouts
    from backwave.databases import place_groups

    try:
        # The raw dict, not get_setting: an unknown BACKWAVE key (E002) must not hide this check.
        groups = conf.worker_groups(user.get("WORKER_GROUPS") or conf.implicit_groups())
        store_timeouts(
            groups, statement_timeout=user.get("WORKER_STATEMENT_TIMEOUT"), lock_timeout=user.get("WORKER_LOCK_TIMEOUT")
        )
        place_groups(groups)  # a group's database: an alias of DATABASES, on PostgreSQL
    except WorkerGroupConfigError as error:
        return str(error)
    return None


def _task_problem(path: str) -> str | None:
    from django.tasks import Task
    from django.utils.module_loading import import_string

    try:
        value = import_string(path)
    except ImportError as error:
        return f"cannot be imported ({error})"
    if not isinstance(value, Task):
        return f"is a {type(value).__name__}, not a task (decorate it with @task)"
    if value.module_path != path:
        return f"is the task {value.module_path!r} under another name; use its wire name"
    return None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@checks.register(TAG)
def check_served_databases(app_configs=None, **kwargs):
    """Warn about each BackWave backend whose database none of the configured worker groups
    serves (``backwave/databases.py``): its jobs would wait for a worker that never comes."""
    from backwave.databases import place_groups, unserved_backends

    try:
        placed = place_groups(conf.worker_groups())
    except (ImproperlyConfigured, ValueError):  # WorkerGroupConfigError is a ValueError
        return []  # backwave.E003 or E006 says what is wrong with the groups
    warnings = []
    for backend in unserved_backends(placed):
        queues = ", ".join(sorted(backend.queues)) or "any queue"
        warnings.append(
            checks.Warning(
                f"TASKS[{backend.alias!r}] enqueues into database {backend.database!r}, which no worker group in "
                "BACKWAVE['WORKER_GROUPS'] serves: its jobs would never run.",
                hint=(
                    f"Add a worker group whose queues include one of {backend.alias!r}'s QUEUES ({queues}), or give a group "
                    f"'database': {backend.database!r}. If another worker serves it (backwave_worker --database "
                    f"{backend.database}), silence backwave.W001."
                ),
                obj=backend.alias,
                id="backwave.W001",
            )
        )
    return warnings


@checks.register(TAG)
def check_served_queues(app_configs=None, **kwargs):
    """Warn about each queue a BackWave backend declares that none of the configured worker
    groups claims on that backend's database: its jobs would wait for ever. Without
    WORKER_GROUPS a plain worker serves every declared queue, so only configured groups miss one;
    a backend whose whole database is unserved is W001's."""
    from backwave.databases import backwave_backends, place_groups, unserved_backends

    try:
        placed = place_groups(conf.worker_groups())
    except (ImproperlyConfigured, ValueError):  # WorkerGroupConfigError is a ValueError
        return []  # backwave.E003 or E006 says what is wrong with the groups
    served = {(group.database, queue) for group in placed for queue in group.policy.queues}
    said_by_w001 = {backend.alias for backend in unserved_backends(placed)}
    warnings = []
    for backend in backwave_backends():
        if backend.alias in said_by_w001:
            continue
        declared = settings.TASKS[backend.alias].get("QUEUES", ["default"])
        for queue in [q for q in declared if q in backend.queues]:  # the settings' order; empty QUEUES: any queue, none named
            if (backend.database, queue) in served:
                continue
            served.add((backend.database, queue))  # one warning per queue and database
            warnings.append(
                checks.Warning(
                    f"Queue {queue!r} of TASKS[{backend.alias!r}] is claimed by no worker group in BACKWAVE['WORKER_GROUPS'] "
                    f"on database {backend.database!r}: its jobs would wait for ever.",
                    hint=(
                        f"Add {queue!r} to a group's queues, or leave WORKER_GROUPS empty (a plain backwave_worker serves every "
                        f"declared queue). If a worker started with --queues serves it, silence backwave.W002."
                    ),
                    obj=backend.alias,
                    id="backwave.W002",
                )
            )
    return warnings

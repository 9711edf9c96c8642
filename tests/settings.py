"""Test settings: the project's, plus the task modules the worker tests run, and a second
database ("other", on the same server) with a backend ("remote") that enqueues there."""

import copy
import os

# The tests' own key, before the project's settings load: otherwise they would generate one into
# the checkout's .secret_key. Worker subprocesses of the tests inherit it.
os.environ.setdefault("SECRET_KEY", "backwave-tests-only-key-never-served-" + "x" * 20)

from project.settings import *  # noqa: E402,F401,F403
from project.settings import BACKWAVE, DATABASES, TASKS  # noqa: E402

# Its own database on the same server; only tests that declare it (django_db(databases=[...]))
# get a test database for it, and its NAME outside tests names no database anyone uses.
DATABASES["other"] = {**copy.deepcopy(DATABASES["default"]), "NAME": f"{DATABASES['default']['NAME']}_other"}

BACKWAVE = {
    # Without the demo's schedule: tests that advance a clock would mint its report jobs among
    # theirs. tests/demo/test_schedule.py puts it back.
    **{key: value for key, value in BACKWAVE.items() if key != "SCHEDULES"},
    "TASK_MODULES": ["tests.shell.worker_tasks", "tests.faults.tasks"],
    "WORKER_GROUPS": [*BACKWAVE["WORKER_GROUPS"], {"name": "remote", "queues": ["remote"]}],
    # Admission's worker tests (tests/shell/test_admission_workers.py).
    "QUEUES": {
        **BACKWAVE.get("QUEUES", {}),
        "keyed": {"key_concurrency_limit": 2},
        "rated": {"rate_limit": 50, "rate_period": 1},
        "solo": {"key_concurrency_limit": 1},
        "single": {"concurrency_limit": 1},
    },
}
# Worker subprocesses of the connection tests (tests/shell/test_connections.py) set their own.
if os.environ.get("BACKWAVE_TEST_WORKER_CONN_MAX_AGE"):
    BACKWAVE["WORKER_CONN_MAX_AGE"] = float(os.environ["BACKWAVE_TEST_WORKER_CONN_MAX_AGE"])
TASKS = {
    "default": {
        **TASKS["default"],
        "QUEUES": [*TASKS["default"]["QUEUES"], "e2e", "slow", "faults", "keyed", "rated", "solo", "single"],
    },
    "remote": {"BACKEND": "backwave.backend.BackWaveBackend", "QUEUES": ["remote"], "OPTIONS": {"DATABASE": "other"}},
}

# Worker subprocesses of the fault tests (tests/faults) get test-only fault injection.
if os.environ.get("BACKWAVE_TEST_FAULTS"):
    from project.settings import INSTALLED_APPS
    from tests.faults.hooks import settings_for

    BACKWAVE = settings_for(BACKWAVE)
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.faults.apps.FaultsConfig"]

# A worker subprocess started by a test must use the test databases pytest-django created.
if os.environ.get("BACKWAVE_TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["BACKWAVE_TEST_DATABASE_NAME"]
    DATABASES["other"]["NAME"] = os.environ.get("BACKWAVE_TEST_OTHER_DATABASE_NAME") or f"{DATABASES['default']['NAME']}_other"
else:
    # One test database per alias and pytest process, so two runs on one server never trample each other.
    for settings_dict in DATABASES.values():
        settings_dict["TEST"] = {"NAME": f"test_{settings_dict['NAME']}_{os.getpid()}"}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Worker and shell subprocesses of the PgBouncer tests (tests/pgbouncer) connect through a
# PgBouncer in transaction pooling mode, with the settings README's "Behind PgBouncer" gives; the
# hint listener may LISTEN on a direct connection ("direct", the server itself).
if os.environ.get("BACKWAVE_TEST_PGBOUNCER"):
    import json

    _bouncer = json.loads(os.environ["BACKWAVE_TEST_PGBOUNCER"])
    _direct = copy.deepcopy(DATABASES["default"])
    for _settings_dict in DATABASES.values():
        _settings_dict.update(HOST="127.0.0.1", PORT=_bouncer["port"], DISABLE_SERVER_SIDE_CURSORS=True)
        _settings_dict["OPTIONS"] = {**_settings_dict.get("OPTIONS", {}), **_bouncer["options"]}
    if _bouncer["hints_direct"]:
        DATABASES["direct"] = _direct
        BACKWAVE["HINT_DATABASES"] = {"default": "direct"}

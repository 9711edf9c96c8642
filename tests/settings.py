"""Test settings: the project's, plus the task modules the worker tests run."""

import os

# The tests' own key, before the project's settings load: otherwise they would generate one into
# the checkout's .secret_key. Worker subprocesses of the tests inherit it.
os.environ.setdefault("SECRET_KEY", "backwave-tests-only-key-never-served-" + "x" * 20)

from project.settings import *  # noqa: E402,F401,F403
from project.settings import BACKWAVE, DATABASES, TASKS  # noqa: E402

BACKWAVE = {**BACKWAVE, "TASK_MODULES": ["tests.shell.worker_tasks", "tests.faults.tasks"]}
# Worker subprocesses of the connection tests (tests/shell/test_connections.py) set their own.
if os.environ.get("BACKWAVE_TEST_WORKER_CONN_MAX_AGE"):
    BACKWAVE["WORKER_CONN_MAX_AGE"] = float(os.environ["BACKWAVE_TEST_WORKER_CONN_MAX_AGE"])
TASKS = {"default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], "e2e", "slow", "faults"]}}

# Worker subprocesses of the fault tests (tests/faults) get test-only fault injection.
if os.environ.get("BACKWAVE_TEST_FAULTS"):
    from project.settings import INSTALLED_APPS
    from tests.faults.hooks import settings_for

    BACKWAVE = settings_for(BACKWAVE)
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.faults.apps.FaultsConfig"]

# A worker subprocess started by a test must use the test database pytest-django created.
if os.environ.get("BACKWAVE_TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["BACKWAVE_TEST_DATABASE_NAME"]
else:
    # One test database per pytest process, so two runs on one server never trample each other.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

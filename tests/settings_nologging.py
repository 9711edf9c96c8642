"""The test settings as a new project has them for logging: no LOGGING at all (Django's default
is the empty dict), for the worker subprocess of tests/shell/test_worker_logging.py."""

from tests.settings import *  # noqa: F401,F403

LOGGING = {}

"""The test settings without ``django.contrib.admin``: a project that does not use Django's admin
(an API-only one). BackWave must migrate, run its commands, ``backwave.cancel()`` and serve its
metrics there (tests/console/test_without_admin.py runs each in a subprocess)."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import BACKWAVE, INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django.contrib.admin"]
ROOT_URLCONF = "tests.urls_noadmin"
BACKWAVE = {**BACKWAVE, "METRICS_TOKEN": "noadmin-metrics-token-for-tests-only"}

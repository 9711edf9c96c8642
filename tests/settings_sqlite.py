"""The test settings on SQLite, startproject's default database: BackWave must refuse it clearly
(backwave.E102) wherever a user meets it first, migrate included
(tests/backend/test_sqlite_refused.py runs manage.py on these in a subprocess)."""

import os

from tests.settings import *  # noqa: F401,F403

_FOLDER = os.environ["BACKWAVE_TEST_SQLITE_DIR"]
DATABASES = {
    alias: {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(_FOLDER, f"{alias}.sqlite3")}
    for alias in ("default", "other")
}

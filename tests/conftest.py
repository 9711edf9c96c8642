"""Shared fixtures. The database is a real PostgreSQL: DATABASE_URL when set, otherwise the
embedded server (project/database.py); pytest-django creates the test database on it."""

import pytest

pytest_plugins = ["backwave.testing.pytest_plugin"]

# The operator's tools cover every database BackWave's backends use (the admin can switch to
# any, backwave_jobs and backwave_queue list reads them all), and the test settings have two:
# "default" and "other" (the "remote" backend's). The tests of those tools get both databases;
# the rest keep the default alone, which costs nothing more than before.
BOTH_DATABASES = ("default", "other")
TOOLS_TESTS = ("tests/admin/", "tests/console/")


def pytest_collection_modifyitems(config, items):
    from pytest_django.fixtures import validate_django_db

    root = config.rootpath
    for item in items:
        if not item.path.relative_to(root).as_posix().startswith(TOOLS_TESTS):
            continue
        marker = item.get_closest_marker("django_db")
        if marker is None and "_django_db_helper" not in item.fixturenames:
            continue  # no database at all
        transaction, reset_sequences, databases, serialized_rollback, available_apps = (
            validate_django_db(marker) if marker is not None else (False, False, None, False, None)
        )
        if databases is not None:
            continue  # the test says which it needs
        item.add_marker(
            pytest.mark.django_db(
                transaction=transaction,
                reset_sequences=reset_sequences,
                databases=BOTH_DATABASES,
                serialized_rollback=serialized_rollback,
                available_apps=available_apps,
            )
        )

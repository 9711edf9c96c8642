"""Shared fixtures. The database is a real PostgreSQL: DATABASE_URL when set, otherwise the
embedded server (project/database.py); pytest-django creates the test database on it."""

import pytest
from django.db.backends.postgresql.operations import DatabaseOperations

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


# A table that is as TRUNCATE leaves it: no heap page, no TOAST page, and no index past its empty
# size (a B-tree's metapage; two pages for the other kinds, so any bigger one counts as written).
# A row ever inserted, even rolled back or vacuumed away, leaves a page in one of them.
WRITTEN_TABLES = """
SELECT c.relname
FROM pg_class c
WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid)
  AND (pg_relation_size(c.oid) > 0
       OR (c.reltoastrelid <> 0 AND pg_relation_size(c.reltoastrelid) > 0)
       OR EXISTS (SELECT FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
                  WHERE i.indrelid = c.oid
                    AND pg_relation_size(i.indexrelid)
                        > CASE am.amname WHEN 'btree' THEN 1 ELSE 2 END * current_setting('block_size')::int))
"""
_sql_flush = DatabaseOperations.sql_flush


def sql_flush_of_written_tables(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    """The TRUNCATE that ends a transactional test, of the tables that test wrote to only.

    Django truncates every table after each one: a TRUNCATE costs about 20 ms a table (new files
    for the table and its indexes), half a second for BackWave's tables, and hundreds of the
    suite's tests commit rows. The tables it skips are already as a TRUNCATE would leave them,
    so every test still starts on the same state; CASCADE takes along the tables that refer to
    a truncated one (a TRUNCATE must), as truncating every table did."""
    with self.connection.cursor() as cursor:
        cursor.execute(WRITTEN_TABLES, [list(tables)])
        written = {name for (name,) in cursor.fetchall()}
    tables = [table for table in tables if table in written]
    return _sql_flush(self, style, tables, reset_sequences=reset_sequences, allow_cascade=True) if tables else []


def pytest_configure(config):
    DatabaseOperations.sql_flush = sql_flush_of_written_tables


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """bin/test's ``--dist loadscope`` with tests/userproject as one scope: its modules share one
    built wheel and virtualenv (a session fixture), and two builds at once would write the same
    egg-info in the checkout. Every other module is a scope of its own, as loadscope has it."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UserProjectAsOneScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/userproject" if nodeid.startswith("tests/userproject/") else super()._split_scope(nodeid)

    return UserProjectAsOneScope(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    """A report as pytest-xdist's worker sends it, with any lone surrogate escaped: tests of
    unstorable values log text that holds one, and UTF-8 (the channel's) cannot carry it."""
    return _escaped_surrogates((yield))


def _escaped_surrogates(value):
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _escaped_surrogates(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_escaped_surrogates(item) for item in value)
    return value

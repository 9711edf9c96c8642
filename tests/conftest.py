"""Shared fixtures. The database is a real PostgreSQL: DATABASE_URL when set, otherwise the
embedded server (project/database.py); pytest-django creates the test database on it."""

pytest_plugins = ["backwave.testing.pytest_plugin"]

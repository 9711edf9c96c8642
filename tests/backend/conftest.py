"""Fixtures for the tasks backend tests: a second database session and direct row factories."""

import uuid

import psycopg
import pytest
from django.db import connection
from django.tasks import task_backends


@pytest.fixture
def backend():
    """The project's BackWave backend ("default")."""
    return task_backends["default"]


@pytest.fixture
def other_session():
    """A second PostgreSQL session on the test database, outside Django's transaction."""
    params = connection.settings_dict
    conn = psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"],
        password=params["PASSWORD"] or None,
        host=params["HOST"],
        port=params["PORT"],
        autocommit=True,
    )
    yield conn
    conn.close()


@pytest.fixture
def make_job():
    """Create a Job row directly with the ORM (for get_result tests)."""
    from backwave.models import Job

    def make(**fields):
        fields.setdefault("task_path", "tests.backend.sample_tasks.add")
        fields.setdefault("payload", {"args": [1, 2], "kwargs": {}})
        fields.setdefault("max_attempts", 3)
        if fields.get("state") == "running":
            fields.setdefault("lease_id", uuid.uuid4())
        return Job.objects.create(**fields)

    return make

"""BackWave's pytest plugin: fixtures for testing your tasks.

Loaded automatically when django-backwave is installed (the ``pytest11`` entry point), or by
naming it in a conftest: ``pytest_plugins = ["backwave.testing.pytest_plugin"]``.

* ``backwave_pump``: a DeterministicPump on the default database, closed after the test.
* ``backwave_jobs``: the enqueued-job assertions (``assert_enqueued``, ``refute_enqueued``,
  ``all``, ``capture``).

Both use pytest-django's ``db`` fixture, so a test that asks for them may touch the database;
mark it ``django_db(transaction=True)`` to run them on committed rows instead.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def backwave_pump(db):
    """A deterministic pump: ``drain()`` runs what is due, ``advance(seconds)`` moves time."""
    from backwave.testing.pump import DeterministicPump

    pump = DeterministicPump()
    yield pump
    pump.close()


@pytest.fixture
def backwave_jobs(db):
    """Assertions about enqueued jobs (see backwave.testing.assertions)."""
    from backwave.testing.assertions import JobAssertions

    return JobAssertions()

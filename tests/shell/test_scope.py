"""The per-attempt scope around a handler: what it checks on entry, and when it need not."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from backwave.shell import scope

pytestmark = pytest.mark.django_db(transaction=True)


def attempts_on_one_thread(touches_the_database: list[bool]) -> None:
    def attempts():
        try:
            for touches in touches_the_database:
                scope.enter_attempt()
                try:
                    if touches:
                        connections["default"].ensure_connection()
                finally:
                    scope.leave_attempt()
        finally:
            connections.close_all()

    thread = threading.Thread(target=attempts)
    thread.start()
    thread.join()


@pytest.fixture
def entry_passes(monkeypatch) -> list[int]:
    passes: list[int] = []
    monkeypatch.setattr(scope, "close_old_connections", lambda: passes.append(1))
    return passes


def test_a_thread_whose_attempts_leave_no_connection_checks_its_connections_on_entry_once(entry_passes):
    attempts_on_one_thread([False] * 5)
    assert len(entry_passes) == 1  # the thread's first attempt: nothing is known of it yet


def test_every_attempt_on_a_thread_that_keeps_a_connection_checks_it_on_entry(entry_passes):
    # The kept connection may be past its maximum age by the time the next attempt starts.
    attempts_on_one_thread([False, True, False, False])
    assert len(entry_passes) == 3  # the first attempt's, then each one after the database was used


def test_an_attempt_after_one_whose_connection_was_closed_skips_the_entry_pass(entry_passes, settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "WORKER_CONN_MAX_AGE": 0}
    attempts_on_one_thread([True, False, True, False])
    # A maximum age of 0 closes the connection as each attempt ends: none is left to check.
    assert len(entry_passes) == 1

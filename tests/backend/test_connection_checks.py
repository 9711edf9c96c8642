"""The connection-budget system checks (backwave.W010, backwave.W011)."""

import pytest

from backwave.connection_checks import check_connection_pool, check_server_connections, connections_per_process


def test_budget_counts_a_store_connection_per_pump_a_listener_and_the_handler_threads():
    assert connections_per_process([{"name": "a", "pumps": 2, "pool_size": 8}, {"name": "b"}]) == (1 + 2 + 1, 16 + 20)


def _with_pool(monkeypatch, max_size):
    from django.conf import settings as django_settings

    # In place and undone after the test: replacing DATABASES itself would reset connections.
    monkeypatch.setitem(django_settings.DATABASES["default"], "OPTIONS", {"pool": {"max_size": max_size}})


def test_pool_smaller_than_the_handler_threads_warns(settings, monkeypatch):
    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "a", "pumps": 2, "pool_size": 16}]}
    _with_pool(monkeypatch, 10)
    (warning,) = check_connection_pool()
    assert warning.id == "backwave.W010"
    assert "32 handler threads" in warning.msg and "at most 10" in warning.msg


def test_a_large_enough_pool_or_no_pool_is_fine(settings, monkeypatch):
    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "a", "pool_size": 4}]}
    assert check_connection_pool() == []
    _with_pool(monkeypatch, 10)
    assert check_connection_pool() == []


@pytest.mark.django_db
def test_more_connections_than_the_server_accepts_warns(settings):
    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "huge", "pumps": 4, "pool_size": 500}]}
    (warning,) = check_server_connections(databases=["default"])
    assert warning.id == "backwave.W011"
    assert "may open 2005 connections" in warning.msg


@pytest.mark.django_db
def test_a_modest_group_fits_the_server(settings):
    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "small", "pool_size": 4}]}
    assert check_server_connections(databases=["default"]) == []
    assert check_server_connections(databases=None) == []

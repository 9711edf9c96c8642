"""Pump health rows: written by pumps, forgotten on a clean stop or after a long silence."""

from __future__ import annotations

import pytest

from backwave.models import Pump
from backwave.store.contract import PumpHealth

from .conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def health(worker_id="h:1:g:0:ab", status="healthy", **fields) -> PumpHealth:
    return PumpHealth(worker_id=worker_id, group="g", hostname="h", pid=1, status=status, lease_duration=30.0, **fields)


def test_record_inserts_then_updates_and_stamps_the_database_clock(store):
    store.record_pumps_many(pumps=[health()])
    first = Pump.objects.get()
    assert (first.status, first.reason, first.in_flight, first.group, first.lease_duration) == ("healthy", "", 0, "g", 30.0)
    store.record_pumps_many(pumps=[health(status="halted", reason="InvalidEvent: nope\x00", in_flight=3)])
    second = Pump.objects.get()
    assert (second.status, second.reason, second.in_flight) == ("halted", "InvalidEvent: nope\\x00", 3)
    assert second.started_at == first.started_at
    assert second.last_heartbeat_at > first.last_heartbeat_at


def test_many_pumps_in_one_statement_and_forgetting_them(store):
    store.record_pumps_many(pumps=[health(f"p{i}") for i in range(3)])
    assert store.round_trips == 1
    assert store.forget_pumps_many(worker_ids=["p0", "p1", "nobody"]) == 2
    assert list(Pump.objects.values_list("worker_id", flat=True)) == ["p2"]
    assert store.forget_pumps_many(worker_ids=[]) == 0


def test_silent_pumps_are_purged(store):
    store.record_pumps_many(pumps=[health("old"), health("fresh")])
    sql("UPDATE backwave_pump SET last_heartbeat_at = now() - interval '2 hours' WHERE worker_id = 'old'")
    assert store.purge_pumps(older_than=3600) == 1
    assert list(Pump.objects.values_list("worker_id", flat=True)) == ["fresh"]

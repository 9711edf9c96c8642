"""The maintenance operations of the Storage Contract (every store kind): schedules synced and
minted once per slot, the retention purge, pump health rows. The shell around them (settings,
cron evaluation) is tested in tests/maintenance."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from backwave.core.options import Retention
from backwave.shell.schedules import mint_due, plan_slots
from backwave.store.contract import PumpHealth, ScheduleDefinition, ScheduleSlot

NOOP = "tests.shell.worker_tasks.noop"
RETENTION = Retention(succeeded=3600.0, failed=86_400.0, cancelled=86_400.0, quarantined=None)


def definition(name: str, cron: str = "* * * * *", **fields) -> ScheduleDefinition:
    return ScheduleDefinition(name=name, task_path=NOOP, cron=cron, **fields)


def health(worker_id="h:1:g:0:ab", status="healthy", **fields) -> PumpHealth:
    return PumpHealth(worker_id=worker_id, group="g", hostname="h", pid=1, status=status, lease_duration=30.0, **fields)


# ---- schedules -----------------------------------------------------------------------------------


def test_sync_writes_rows_and_disables_the_undeclared(store, rows):
    assert (
        store.sync_schedules(
            schedules=[definition("a", args=[7], queue="e2e", priority=5, tags=("t",)), definition("b", "0 * * * *")]
        )
        == []
    )
    a = rows.schedules()["a"]
    assert (a.task_path, a.cron, a.args, a.kwargs, a.queue, a.priority, a.tags, a.enabled) == (
        NOOP,
        "* * * * *",
        [7],
        {},
        "e2e",
        5,
        ["t"],
        True,
    )
    assert (a.last_slot, a.next_run) == (None, None)
    mint_due(store)  # computes next_run for both
    first = {name: row.next_run for name, row in rows.schedules().items()}
    assert all(first.values())

    assert store.sync_schedules(schedules=[definition("a", args=[1]), definition("c", "0 0 * * *")]) == ["b"]
    after = rows.schedules()
    assert after["a"].next_run == first["a"] and after["a"].args == [1]
    assert (after["b"].enabled, after["b"].next_run) == (False, None)
    assert after["c"].enabled and after["c"].next_run is None

    store.sync_schedules(schedules=[definition("a", "*/10 * * * *"), definition("b", "0 * * * *")])
    after = rows.schedules()
    assert after["a"].next_run is None, "a new expression starts afresh"
    assert after["b"].enabled and after["b"].next_run is None, "re-enabled: no catching up"


def test_due_schedules_come_unknown_first_then_oldest_with_the_database_clock(store, rows):
    store.sync_schedules(
        schedules=[
            definition("late"),
            definition("new"),
            definition("later"),
            definition("off", enabled=False),
            definition("future"),
        ]
    )
    rows.make_due("late", seconds_ago=120)
    rows.make_due("later", seconds_ago=60)
    rows.make_due("future", seconds_ago=-3600)
    before = rows.now()
    due = store.due_schedules(limit=10)
    after = rows.now()
    assert [d.name for d in due] == ["new", "late", "later"]
    assert all(before <= d.db_now <= after for d in due)
    assert [d.name for d in store.due_schedules(limit=1)] == ["new"]


def test_a_due_slot_becomes_one_job_like_an_enqueued_one(store, rows):
    store.sync_schedules(schedules=[definition("five", "*/5 * * * *", args=[42], queue="e2e", max_attempts=3, backoff_base=2.0)])
    mint_due(store)
    rows.make_due("five", seconds_ago=600)
    (job_id,) = mint_due(store)
    job, schedule = rows.job(job_id), rows.schedules()["five"]
    now = rows.now()
    assert job.schedule_id == schedule.id and job.schedule_slot == schedule.last_slot == job.run_at
    assert job.schedule_slot <= now and job.schedule_slot.minute % 5 == 0 and job.schedule_slot.second == 0
    assert now - job.schedule_slot < timedelta(minutes=5), "the latest slot that has passed"
    assert (job.task_path, job.payload, job.queue, job.state, job.attempts, job.max_attempts, job.backoff_base) == (
        NOOP,
        {"args": [42], "kwargs": {}},
        "e2e",
        "ready",
        0,
        3,
        2.0,
    )
    assert schedule.next_run > now
    assert mint_due(store) == []


def test_a_minted_job_carries_the_schedules_limit_key(store, rows):
    store.sync_schedules(schedules=[definition("keyed", "*/5 * * * *", limit_key="acme"), definition("plain", "*/5 * * * *")])
    mint_due(store)
    rows.make_due("keyed", seconds_ago=600)
    rows.make_due("plain", seconds_ago=600)
    minted = mint_due(store)
    assert sorted(rows.job(job_id).limit_key or "" for job_id in minted) == ["", "acme"]


def test_after_downtime_only_the_latest_missed_slot_is_minted_once(store, rows):
    store.sync_schedules(schedules=[definition("minutely")])
    mint_due(store)
    rows.make_due("minutely", seconds_ago=90 * 60)
    assert len(mint_due(store)) == 1
    assert mint_due(store) == []
    assert rows.count() == 1


def test_an_older_slot_a_taken_slot_and_a_changed_expression_mint_nothing(store, rows):
    store.sync_schedules(schedules=[definition("s")])
    mint_due(store)
    rows.make_due("s", seconds_ago=120)
    (job_id,) = mint_due(store)
    schedule = rows.schedules()["s"]
    rows.make_due("s", seconds_ago=1)
    older = ScheduleSlot(
        schedule_id=schedule.id, cron="* * * * *", slot=schedule.last_slot - timedelta(minutes=5), next_run=schedule.next_run
    )
    assert store.mint_schedules_many(slots=[older]) == []
    rows.set_schedule("s", last_slot=None)
    taken = ScheduleSlot(schedule_id=schedule.id, cron="* * * * *", slot=schedule.last_slot, next_run=schedule.next_run)
    assert store.mint_schedules_many(slots=[taken]) == [], "one job per (schedule, slot), by constraint"
    rows.make_due("s", seconds_ago=1)
    due = store.due_schedules(limit=10)
    rows.set_schedule("s", cron="*/2 * * * *")
    assert store.mint_schedules_many(slots=plan_slots(due)) == []
    assert list(rows.jobs()) == [job_id]


def test_a_slot_of_none_only_moves_next_run_and_a_schedule_not_due_is_skipped(store, rows):
    store.sync_schedules(schedules=[definition("s")])
    (schedule,) = rows.schedules().values()
    later = rows.now() + timedelta(hours=1)
    assert (
        store.mint_schedules_many(slots=[ScheduleSlot(schedule_id=schedule.id, cron="* * * * *", slot=None, next_run=later)])
        == []
    )
    assert (rows.schedules()["s"].next_run, rows.schedules()["s"].last_slot) == (later, None)
    slot = rows.now() - timedelta(minutes=1)
    assert (
        store.mint_schedules_many(slots=[ScheduleSlot(schedule_id=schedule.id, cron="* * * * *", slot=slot, next_run=later)])
        == []
    )
    assert rows.count() == 0


def test_nothing_to_mint_costs_no_round_trip(store):
    before = store.round_trips
    assert store.mint_schedules_many(slots=[]) == []
    assert store.round_trips == before


# ---- retention -----------------------------------------------------------------------------------


def roll_up_everything(store) -> int:
    """As maintenance does before each purge, until every attempt is in the statistics: the first
    run of a store may only take the rollup's horizon (and re-create its row, after a flush)."""
    return sum(store.roll_up_task_stats(limit=10_000, settle=0) for _ in range(3))


def test_only_finished_jobs_past_their_states_retention_are_purged_with_their_attempts(store, rows):
    old = [
        rows.finished_job("succeeded", seconds_ago=7200, attempts=2),
        rows.finished_job("failed", seconds_ago=90_000, attempts=3),
    ]
    kept = [
        rows.finished_job("succeeded", seconds_ago=1800),
        rows.finished_job("failed", seconds_ago=80_000),
        rows.finished_job("quarantined", seconds_ago=10**7),
        rows.finished_job("ready", seconds_ago=None),
    ]
    assert roll_up_everything(store) == 5
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1000) == 2
    assert sorted(rows.jobs()) == kept
    assert not [a for a in rows.attempts() if a.job_id in old], "attempts go with their job"
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1000) == 0


def test_a_purge_is_paged_oldest_first(store, rows):
    ids = [rows.finished_job("succeeded", seconds_ago=3600 * (10 - n), attempts=1) for n in range(7)]
    roll_up_everything(store)
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=3) == 3
    assert sorted(rows.jobs()) == ids[3:]
    assert [store.purge_jobs(older_than=RETENTION.job_states, limit=3) for _ in range(2)] == [3, 1]
    assert rows.jobs() == {} and rows.attempts() == []


def test_a_job_whose_attempts_are_not_in_the_statistics_yet_is_kept_until_they_are(store, rows):
    store.roll_up_task_stats(limit=10, settle=0)  # the rollup's row exists (it is written again after a flush)
    rolled = rows.finished_job("succeeded", seconds_ago=7200, attempts=1)
    assert roll_up_everything(store) == 1
    waiting = rows.finished_job("succeeded", seconds_ago=7200, attempts=2)
    never_ran = rows.finished_job("cancelled", seconds_ago=90_000)  # no attempt: nothing to wait for
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1000) == 2
    assert sorted(rows.jobs()) == [waiting]
    assert roll_up_everything(store) == 2
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=1000) == 1
    assert rows.jobs() == {}


def test_nothing_listed_nothing_purged_and_no_round_trip(store, rows):
    rows.finished_job("succeeded", seconds_ago=10**6)
    before = store.round_trips
    assert store.purge_jobs(older_than=(), limit=100) == 0
    assert store.purge_jobs(older_than=RETENTION.job_states, limit=0) == 0
    assert store.round_trips == before and rows.count() == 1


# ---- pump health ---------------------------------------------------------------------------------


def test_record_inserts_then_updates_and_stamps_the_clock(store, rows):
    store.record_pumps_many(pumps=[health()])
    first = rows.pumps()["h:1:g:0:ab"]
    assert (first.status, first.reason, first.in_flight, first.group, first.lease_duration) == ("healthy", "", 0, "g", 30.0)
    started, beat = first.started_at, first.last_heartbeat_at
    store.record_pumps_many(pumps=[health(status="halted", reason="InvalidEvent: nope\x00", in_flight=3)])
    second = rows.pumps()["h:1:g:0:ab"]
    assert (second.status, second.reason, second.in_flight) == ("halted", "InvalidEvent: nope\\x00", 3)
    assert second.started_at == started and second.last_heartbeat_at > beat


def test_many_pumps_in_one_operation_and_forgetting_them(store, rows):
    before = store.round_trips
    store.record_pumps_many(pumps=[health(f"p{i}") for i in range(3)])
    store.record_pumps_many(pumps=[])
    assert store.round_trips == before + 1
    assert store.forget_pumps_many(worker_ids=["p0", "p1", "nobody"]) == 2
    assert list(rows.pumps()) == ["p2"]
    assert store.forget_pumps_many(worker_ids=[]) == 0


def test_silent_pumps_are_purged(store, rows):
    store.record_pumps_many(pumps=[health("old"), health("fresh")])
    rows.silence_pump("old", seconds=7200)
    assert store.purge_pumps(older_than=3600) == 1
    assert list(rows.pumps()) == ["fresh"]


def test_a_due_queue_no_live_pump_serves_is_unserved(store, rows, open_lease):
    """A pump serves the queues its row lists while it is not halted and its lease lives; a
    paused queue, and one whose jobs are not due yet, wait on purpose."""
    from .helpers import ago

    rows.make_jobs(1, queue="default", run_at=ago(30))
    rows.make_jobs(1, queue="emails", run_at=ago(20), priority=-5)
    rows.make_jobs(1, queue="emails", run_at=ago(5), priority=5)
    rows.make_jobs(1, queue="later", run_at=ago(-3600))
    rows.make_jobs(1, queue="stopped", run_at=ago(60))
    rows.set_queue("stopped", paused=True)
    assert [queue for queue, _ in store.unserved_queues()] == ["default", "emails"]  # no pump at all

    serving = open_lease("h:1:g:0:ab")
    store.record_pumps_many(
        pumps=[health("h:1:g:0:ab", queues=("default",)), health("h:2:g:0:cd", status="halted", queues=("emails",))]
    )
    open_lease("h:2:g:0:cd")
    ((queue, waited),) = store.unserved_queues()
    assert queue == "emails" and 19 < waited < 3600, "the oldest due job of any priority, by the database clock"
    assert rows.pumps()["h:1:g:0:ab"].queues == ["default"]

    rows.lapse(serving.id)
    assert [queue for queue, _ in store.unserved_queues()] == ["default", "emails"]


# -- the planner's statistics --------------------------------------------------------------------


def _planner_rows(table: str) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table])
        return cursor.fetchone()[0]


@pytest.mark.stores("postgres")
def test_statistics_that_fell_behind_are_refreshed_and_fresh_ones_left_alone(store, rows):
    """Analyzed while empty, then 5,000 jobs later: the planner still counts about none, and
    (with autovacuum off, as on this test server) nothing would ever tell it otherwise."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE backwave_job, backwave_attempt, backwave_dependency, backwave_transition")
    assert store.refresh_statistics() == []  # all fresh: the check, and no ANALYZE
    rows.make_jobs(5000)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # the counters this session owes, now
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert _planner_rows("backwave_job") < 100

    before = store.round_trips
    assert store.refresh_statistics() == ["backwave_job"]
    assert store.round_trips == before + 2  # the check, then the ANALYZE of what it found
    assert _planner_rows("backwave_job") >= 4000
    assert store.refresh_statistics() == []


@pytest.mark.stores("memory")
def test_a_store_without_a_planner_has_no_statistics_to_refresh(store, rows):
    rows.make_jobs(5000)
    before = store.round_trips
    assert store.refresh_statistics() == []
    assert store.round_trips == before


def test_every_table_the_check_may_name_has_its_analyze_statement():
    from backwave.store.contract import ANALYZED_TABLES
    from backwave.store.queries import QUERIES

    assert {f"analyze_{table}": f"ANALYZE (SKIP_LOCKED) {table}" for table in ANALYZED_TABLES} == {
        name: text for name, text in QUERIES.items() if name.startswith("analyze_")
    }

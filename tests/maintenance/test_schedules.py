"""Schedules on PostgreSQL: settings synced to rows, slots minted once by the database clock."""

from __future__ import annotations

import datetime as dt
import threading
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from backwave.models import Job, Schedule
from backwave.tasking.registry import TaskRegistry
from backwave.conf import ScheduleConfigError
from backwave.shell.schedules import mint_due, plan_slots, sync_schedules
from backwave.store.contract import DueSchedule, ScheduleSlot
from tests.shell import worker_tasks

from .conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = TaskRegistry([worker_tasks.noop, worker_tasks.flaky, worker_tasks.always_fails])
NOOP = worker_tasks.noop.module_path


def db_now() -> datetime:
    return sql("SELECT now()")[0][0]


def due_in_the_past(name: str, *, minutes: float) -> None:
    """Pretend the schedule's next run came ``minutes`` ago (the cluster was down meanwhile)."""
    sql("UPDATE backwave_schedule SET next_run = now() - make_interval(secs => %s) WHERE name = %s", [minutes * 60, name])


# ---- sync ----------------------------------------------------------------------------------------


def test_sync_writes_each_schedule_with_the_job_fields_of_its_task(store):
    disabled = sync_schedules(
        store,
        {
            "every-five": {"task": NOOP, "cron": "*/5 * * * *", "args": [7], "kwargs": {}},
            "retried": {
                "task": worker_tasks.flaky.module_path,
                "cron": "0 3 * * *",
                "kwargs": {"succeed_on": 2},
                "priority": 5,
                "queue": "slow",
            },
        },
        REGISTRY,
    )
    assert disabled == []
    five = Schedule.objects.get(name="every-five")
    assert (five.task_path, five.cron, five.args, five.kwargs, five.queue, five.enabled) == (
        NOOP,
        "*/5 * * * *",
        [7],
        {},
        "e2e",
        True,
    )
    assert (five.max_attempts, five.backend, five.last_slot, five.next_run) == (3, "default", None, None)
    retried = Schedule.objects.get(name="retried")
    # The task's own retry options, the schedule's queue and priority.
    assert (retried.queue, retried.priority, retried.max_attempts, retried.backoff_base, retried.backoff_max) == (
        "slow",
        5,
        3,
        0.05,
        0.05,
    )


def test_resync_keeps_next_run_unless_the_expression_changes_and_disables_what_is_gone(store):
    spec = {"a": {"task": NOOP, "cron": "*/5 * * * *"}, "b": {"task": NOOP, "cron": "0 * * * *"}}
    sync_schedules(store, spec, REGISTRY)
    mint_due(store)  # computes next_run for both
    first = dict(Schedule.objects.values_list("name", "next_run"))
    assert all(first.values())

    disabled = sync_schedules(
        store, {"a": {"task": NOOP, "cron": "*/5 * * * *", "args": [1]}, "c": {"task": NOOP, "cron": "0 0 * * *"}}, REGISTRY
    )
    assert disabled == ["b"]
    rows = {s.name: s for s in Schedule.objects.all()}
    assert rows["a"].next_run == first["a"] and rows["a"].args == [1]
    assert (rows["b"].enabled, rows["b"].next_run) == (False, None)
    assert rows["c"].enabled and rows["c"].next_run is None

    sync_schedules(store, {"a": {"task": NOOP, "cron": "*/10 * * * *"}, "b": {"task": NOOP, "cron": "0 * * * *"}}, REGISTRY)
    rows = {s.name: s for s in Schedule.objects.all()}
    assert rows["a"].next_run is None, "a new expression starts afresh"
    assert rows["b"].enabled and rows["b"].next_run is None, "re-enabled: starts at its next slot, no catching up"


def test_a_schedule_disabled_in_settings_mints_nothing(store):
    sync_schedules(store, {"off": {"task": NOOP, "cron": "* * * * * *", "enabled": False}}, REGISTRY)
    assert store.due_schedules(limit=10) == []
    assert mint_due(store) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"task": "tests.shell.worker_tasks.nop", "cron": "* * * * *"},
            "not registered in this worker. Did you mean 'tests.shell.worker_tasks.noop'?",
        ),
        ({"task": NOOP, "cron": "* * * * *", "args": [object()]}, "must be plain JSON"),
        ({"task": NOOP, "cron": "* * * * *", "queue": "nowhere"}, "is not one of backend 'default''s QUEUES"),
    ],
)
def test_a_schedule_this_worker_cannot_run_is_refused_before_anything_is_written(store, spec, message):
    with pytest.raises(ScheduleConfigError, match=message) as error:
        sync_schedules(store, {"good": {"task": NOOP, "cron": "* * * * *"}, "bad": spec}, REGISTRY)
    assert "BACKWAVE['SCHEDULES']['bad']" in str(error.value)
    assert Schedule.objects.count() == 0


# ---- minting -------------------------------------------------------------------------------------


def test_a_new_schedule_starts_at_its_next_slot(store):
    sync_schedules(store, {"hourly": {"task": NOOP, "cron": "0 * * * *"}}, REGISTRY)
    before = db_now()
    assert mint_due(store) == []
    schedule = Schedule.objects.get()
    assert before < schedule.next_run <= before + timedelta(hours=1)
    assert schedule.next_run.minute == 0 and schedule.next_run.second == 0
    assert mint_due(store) == []  # not due yet


def test_a_due_slot_becomes_one_job_like_an_enqueued_one(store):
    sync_schedules(store, {"five": {"task": NOOP, "cron": "*/5 * * * *", "args": [42]}}, REGISTRY)
    mint_due(store)
    due_in_the_past("five", minutes=10)
    (job_id,) = mint_due(store)
    job = Job.objects.get(id=job_id)
    schedule = Schedule.objects.get()
    now = db_now()
    assert job.schedule_id == schedule.id and job.schedule_slot == schedule.last_slot == job.run_at
    assert job.schedule_slot <= now and job.schedule_slot.minute % 5 == 0 and job.schedule_slot.second == 0
    assert now - job.schedule_slot < timedelta(minutes=5), "the latest slot that has passed"
    assert (job.task_path, job.payload, job.queue, job.state, job.attempts, job.max_attempts) == (
        NOOP,
        {"args": [42], "kwargs": {}},
        "e2e",
        "ready",
        0,
        3,
    )
    assert schedule.next_run > now
    assert mint_due(store) == []


def test_a_minted_job_carries_its_tasks_time_limit(store):
    registry = TaskRegistry([worker_tasks.overruns_first_attempt])
    sync_schedules(store, {"limited": {"task": worker_tasks.overruns_first_attempt.module_path, "cron": "*/5 * * * *"}}, registry)
    assert Schedule.objects.get().timeout == 0.5
    mint_due(store)
    due_in_the_past("limited", minutes=10)
    (job_id,) = mint_due(store)
    assert Job.objects.get(id=job_id).timeout == 0.5


def test_a_minted_job_carries_its_tasks_per_key_limit_key(store):
    """A schedule of a task with limit_by mints jobs under that key, as an enqueue would: without
    it a scheduled job would run outside its queue's per-key limit."""
    registry = TaskRegistry([worker_tasks.per_customer])
    sync_schedules(
        store, {"nightly": {"task": worker_tasks.per_customer.module_path, "cron": "*/5 * * * *", "args": ["acme"]}}, registry
    )
    assert Schedule.objects.get().limit_key == "acme"
    mint_due(store)
    due_in_the_past("nightly", minutes=10)
    (job_id,) = mint_due(store)
    assert (Job.objects.get(id=job_id).limit_key, Job.objects.get(id=job_id).queue) == ("acme", "keyed")


def test_a_schedule_of_a_context_task_keys_its_limit_by_its_arguments(store):
    """The schedule's arguments bind to the task's signature without the context, as an
    enqueue's do: bound with it, "acme" went to the context and every slot got the default key."""
    from tests.backend import sample_tasks

    task = sample_tasks.call_api_with_context
    registry = TaskRegistry([task])
    sync_schedules(store, {"nightly": {"task": task.module_path, "cron": "*/5 * * * *", "args": ["acme"]}}, registry)
    assert Schedule.objects.get().limit_key == "acme"
    mint_due(store)
    due_in_the_past("nightly", minutes=10)
    (job_id,) = mint_due(store)
    assert Job.objects.get(id=job_id).limit_key == "acme"


def test_a_schedule_of_a_unique_task_is_refused_before_anything_is_written(store):
    from tests.backend import sample_tasks

    registry = TaskRegistry([worker_tasks.noop, sample_tasks.sync_order])
    spec = {"task": sample_tasks.sync_order.module_path, "cron": "* * * * *", "kwargs": {"order_id": 1}}
    with pytest.raises(ScheduleConfigError, match="declares uniqueness") as error:
        sync_schedules(store, {"good": {"task": NOOP, "cron": "* * * * *"}, "orders": spec}, registry)
    assert "BACKWAVE['SCHEDULES']['orders']" in str(error.value)
    assert Schedule.objects.count() == 0


def test_after_downtime_only_the_latest_missed_slot_is_minted_once(store):
    sync_schedules(store, {"minutely": {"task": NOOP, "cron": "* * * * *"}}, REGISTRY)
    mint_due(store)
    due_in_the_past("minutely", minutes=90)  # ninety slots missed
    assert len(mint_due(store)) == 1
    for _ in range(3):
        assert mint_due(store) == []
    assert Job.objects.count() == 1


def test_each_slot_is_one_job_by_constraint(store):
    sync_schedules(store, {"s": {"task": NOOP, "cron": "* * * * *"}}, REGISTRY)
    schedule = Schedule.objects.get()
    slot = timezone.now().replace(second=0, microsecond=0)
    Job.objects.create(task_path=NOOP, payload={"args": [], "kwargs": {}}, schedule=schedule, schedule_slot=slot)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(task_path=NOOP, payload={"args": [], "kwargs": {}}, schedule=schedule, schedule_slot=slot)
    # The mint runs into it and does nothing, whatever last_slot says.
    sql("UPDATE backwave_schedule SET next_run = %s", [slot])
    minted = store.mint_schedules_many(
        slots=[ScheduleSlot(schedule_id=schedule.id, cron="* * * * *", slot=slot, next_run=slot + timedelta(minutes=1))]
    )
    assert minted == []
    assert Job.objects.filter(schedule=schedule).count() == 1


def test_an_older_slot_than_the_last_minted_is_never_minted(store):
    sync_schedules(store, {"s": {"task": NOOP, "cron": "* * * * *"}}, REGISTRY)
    mint_due(store)
    due_in_the_past("s", minutes=2)
    (job_id,) = mint_due(store)
    schedule = Schedule.objects.get()
    sql("UPDATE backwave_schedule SET next_run = now() - interval '1 second'")  # due again
    stale = ScheduleSlot(
        schedule_id=schedule.id, cron="* * * * *", slot=schedule.last_slot - timedelta(minutes=5), next_run=schedule.next_run
    )
    assert store.mint_schedules_many(slots=[stale]) == []
    assert Schedule.objects.get().last_slot == schedule.last_slot


def test_slots_computed_for_an_expression_that_changed_meanwhile_are_dropped(store):
    sync_schedules(store, {"s": {"task": NOOP, "cron": "* * * * *"}}, REGISTRY)
    mint_due(store)
    due_in_the_past("s", minutes=2)
    due = store.due_schedules(limit=10)
    sql("UPDATE backwave_schedule SET cron = '*/2 * * * *'")  # an operator or a sync, in between
    assert store.mint_schedules_many(slots=plan_slots(due)) == []


def test_a_row_with_an_expression_croniter_cannot_read_is_skipped_not_fatal(store, caplog):
    sync_schedules(store, {"good": {"task": NOOP, "cron": "* * * * *"}, "broken": {"task": NOOP, "cron": "* * * * *"}}, REGISTRY)
    mint_due(store)
    due_in_the_past("good", minutes=2)
    sql("UPDATE backwave_schedule SET cron = 'every tuesday', next_run = now() - interval '1 minute' WHERE name = 'broken'")
    assert len(mint_due(store)) == 1
    assert "Schedule 'broken' has a cron expression that cannot be evaluated" in caplog.text


def test_concurrent_minters_mint_each_slot_once(make_store):
    """Eight maintenance runs released at the same instant, for many rounds: every slot of every
    schedule is one job, and the minters' own counts add up to exactly that many."""
    setup = make_store()
    sync_schedules(setup, {f"s{i}": {"task": NOOP, "cron": "* * * * * *"} for i in range(10)}, REGISTRY)
    mint_due(setup)
    stores = [make_store() for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    minted: list[int] = []
    errors: list[BaseException] = []
    rounds = 30

    def run(store):
        try:
            for _ in range(rounds):
                barrier.wait(timeout=30)
                minted.extend(mint_due(store))
                time.sleep(0.1)
        except BaseException as error:  # surfaced below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(minted) == len(set(minted)) == Job.objects.count() > 10
    per_slot = sql("SELECT schedule_id, schedule_slot, count(*) FROM backwave_job GROUP BY 1, 2 HAVING count(*) > 1")
    assert per_slot == []


# ---- the database clock, not the host's ----------------------------------------------------------


def test_a_skewed_host_clock_changes_nothing(store, monkeypatch):
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 7 * 86_400)
    monkeypatch.setattr(timezone, "now", lambda: dt.datetime.now(UTC) + timedelta(days=7))
    sync_schedules(store, {"s": {"task": NOOP, "cron": "* * * * * *"}}, REGISTRY)
    mint_due(store)
    time.sleep(1.1)
    (job_id,) = mint_due(store)
    slot = Job.objects.get(id=job_id).schedule_slot
    assert timedelta(0) <= db_now() - slot < timedelta(seconds=5)


def test_slots_follow_the_time_zone_and_the_given_clock():
    paris = ZoneInfo("Europe/Paris")
    db_clock = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)  # 03:30 in Paris, the night clocks go forward
    due = [
        DueSchedule(id=1, name="three", cron="0 3 * * *", next_run=datetime(2026, 3, 28, 2, 0, tzinfo=UTC), db_now=db_clock),
        DueSchedule(id=2, name="new", cron="*/15 * * * *", next_run=None, db_now=db_clock),
        DueSchedule(id=3, name="exact", cron="30 1 * * *", next_run=datetime(2026, 3, 28, 1, 30, tzinfo=UTC), db_now=db_clock),
    ]
    three, new, exact = plan_slots(due, paris)
    assert three.slot == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 Paris (summer time)
    assert three.next_run == datetime(2026, 3, 30, 1, 0, tzinfo=UTC)
    assert (new.slot, new.next_run) == (None, datetime(2026, 3, 29, 1, 45, tzinfo=UTC))
    exact_utc = plan_slots([due[2]], UTC)[0]
    assert exact_utc.slot == db_clock, "a slot falling exactly on the clock has passed"


def test_the_unique_index_is_partial_so_plain_enqueues_never_write_to_it():
    (definition,) = sql("SELECT indexdef FROM pg_indexes WHERE indexname = 'backwave_job_schedule_slot_once'")[0:1]
    assert "UNIQUE" in definition[0] and "WHERE (schedule_id IS NOT NULL)" in definition[0]
    assert not sql("SELECT 1 FROM pg_indexes WHERE tablename = 'backwave_job' AND indexdef LIKE '%%(schedule_id)%%'")

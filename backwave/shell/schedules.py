"""Schedules in the shell: settings become rows at worker start, cron becomes slots at maintenance.

The core decides *when* maintenance runs (``MintSchedules``); the shell does the part that needs a
library and a time zone: evaluating cron expressions (croniter). It never reads the host clock for
that: ``due_schedules`` returns the database's ``now()`` with the due rows, and every slot is
computed from it, so a worker whose clock is off by an hour mints exactly what any other would.

Catch-up is deliberate and bounded: when a schedule's next run has passed (the cluster was down,
or maintenance ran late), only the latest slot that has passed is minted, once; the slots before
it are skipped, not replayed one per missed tick.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING

from croniter import croniter

from backwave.store.contract import DueSchedule, ScheduleDefinition, ScheduleSlot, Store

if TYPE_CHECKING:  # minting needs no Django: the executor, and the simulator through it, load without it
    from .registry import TaskRegistry

logger = logging.getLogger("backwave.schedules")

# Schedules handled per maintenance run; the rest are due still and wait for the next run.
MINT_BATCH = 100


class ScheduleConfigError(ValueError):
    """A declared schedule cannot be run by this worker (unknown task, bad arguments...)."""


def definitions_from_settings(schedules: Mapping[str, Mapping], registry: TaskRegistry) -> list[ScheduleDefinition]:
    """The rows to write for ``BACKWAVE["SCHEDULES"]`` (already shape-checked by ``conf``).

    Each schedule's job fields are what enqueueing its task would write (queue, priority, retry
    options, backend, tags, with the schedule's overrides), validated the same way, so a minted
    job is indistinguishable from an enqueued one.
    """
    definitions = []
    for name, spec in schedules.items():
        where = f"BACKWAVE['SCHEDULES'][{name!r}]"
        task = registry.get(spec["task"])
        if task is None:
            close = difflib.get_close_matches(spec["task"], list(registry), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ScheduleConfigError(
                f"{where} names the task {spec['task']!r}, which is not registered in this worker.{hint} "
                "A task is registered when it is defined in an installed app's tasks.py or in a module of BACKWAVE['TASK_MODULES']."
            )
        overrides = {"queue_name": spec.get("queue"), "priority": spec.get("priority"), "max_attempts": spec.get("max_attempts")}
        overrides = {key: value for key, value in overrides.items() if value is not None}
        try:
            task = task.using(**overrides)
            backend = task.get_backend()
            build_job = getattr(backend, "build_job", None)
            if build_job is None:
                raise ScheduleConfigError(f"{where}: the task's backend {task.backend!r} is not a BackWave backend.")
            job = build_job(task, spec.get("args", []), spec.get("kwargs", {}))
        except ScheduleConfigError:
            raise
        except Exception as error:  # InvalidTask, TypeError from .using(): the message says what is wrong
            raise ScheduleConfigError(f"{where}: {error}") from error
        definitions.append(
            ScheduleDefinition(
                name=name,
                task_path=job.task_path,
                cron=spec["cron"],
                args=job.payload["args"],
                kwargs=job.payload["kwargs"],
                queue=job.queue,
                priority=job.priority,
                max_attempts=job.max_attempts,
                backoff_base=job.backoff_base,
                backoff_max=job.backoff_max,
                backend=job.backend,
                tags=tuple(job.tags),
                enabled=spec.get("enabled", True),
            )
        )
    return definitions


def sync_schedules(store: Store, schedules: Mapping[str, Mapping], registry: TaskRegistry, *, database: str | None = None) -> list[str]:
    """Write the declared schedules to the store; returns the names of rows no longer declared
    (now disabled). Raises ScheduleConfigError before writing anything when one is unusable.

    ``database``: the store's Django alias; only the schedules whose task's backend enqueues into
    it are written there (a minted job lands where its backend's jobs live), and the others
    count as not declared in it. None writes them all (a store outside Django's databases)."""
    definitions = definitions_from_settings(schedules, registry)
    if database is not None:
        from backwave.databases import backend_database

        definitions = [d for d in definitions if backend_database(d.backend) == database]
    disabled = store.sync_schedules(schedules=definitions)
    if definitions:
        logger.info("Schedules: %s", ", ".join(f"{d.name} ({d.cron}{'' if d.enabled else ', disabled'})" for d in definitions))
    if disabled:
        logger.warning("Schedules no longer declared in BACKWAVE['SCHEDULES'], now disabled: %s", ", ".join(disabled))
    return disabled


def plan_slots(due: Sequence[DueSchedule], tz: tzinfo = UTC) -> list[ScheduleSlot]:
    """For each due schedule, the slot to mint (the latest that has passed by the database clock,
    or none for a schedule whose next run was never computed) and its next run after that clock.

    A row whose expression croniter cannot evaluate (edited by hand) is logged and skipped; it
    stays due, and is reported again at each maintenance run until it is fixed.
    """
    slots = []
    for schedule in due:
        try:
            now = schedule.db_now.astimezone(tz)
            next_run = croniter(schedule.cron, now).get_next(datetime)
            slot = None
            if schedule.next_run is not None:
                # get_prev is strictly before its start: a microsecond later makes a slot that
                # falls exactly on now() count as passed.
                slot = croniter(schedule.cron, now + timedelta(microseconds=1)).get_prev(datetime)
                if slot < schedule.next_run:
                    slot = None  # next_run was not one of the expression's slots: just move on
        except Exception as error:  # croniter's errors have no common base worth naming
            logger.error("Schedule %r has a cron expression that cannot be evaluated (%r): %s", schedule.name, schedule.cron, error)
            continue
        slots.append(
            ScheduleSlot(
                schedule_id=schedule.id,
                cron=schedule.cron,
                slot=None if slot is None else slot.astimezone(UTC),
                next_run=next_run.astimezone(UTC),
            )
        )
    return slots


def mint_due(store: Store, tz: tzinfo = UTC) -> list[int]:
    """One maintenance run's minting: due schedules, their slots, the mint. Returns job ids."""
    due = store.due_schedules(limit=MINT_BATCH)
    if not due:
        return []
    minted = store.mint_schedules_many(slots=plan_slots(due, tz))
    if minted:
        logger.info("Minted %d job(s) from schedules", len(minted))
    return minted

"""Schedules in the shell: settings become rows at worker start (parsed by ``backwave.conf``), cron becomes slots at maintenance.

The core decides *when* maintenance runs (``MintSchedules``); the shell does the part that needs a
library and a time zone: evaluating cron expressions (croniter). It never reads the host clock for
that: ``due_schedules`` returns the database's ``now()`` with the due rows, and every slot is
computed from it, so a worker whose clock is off by an hour mints exactly what any other would.

Catch-up is deliberate and bounded: when a schedule's next run has passed (the cluster was down,
or maintenance ran late), only the latest slot that has passed is minted, once; the slots before
it are skipped, not replayed one per missed tick.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING

from backwave.store.contract import DueSchedule, ScheduleSlot, Store

if TYPE_CHECKING:  # minting needs no Django: the executor, and the simulator through it, load without it
    from backwave.tasking.registry import TaskRegistry

logger = logging.getLogger("backwave.schedules")

# Schedules handled per maintenance run; the rest are due still and wait for the next run.
MINT_BATCH = 100


def sync_schedules(
    store: Store, schedules: Mapping[str, Mapping], registry: TaskRegistry, *, database: str | None = None
) -> list[str]:
    """Write the declared schedules to the store; returns the names of rows no longer declared
    (now disabled). Raises ScheduleConfigError before writing anything when one is unusable.

    ``database``: the store's Django alias; only the schedules whose task's backend enqueues into
    it are written there (a minted job lands where its backend's jobs live), and the others
    count as not declared in it. None writes them all (a store outside Django's databases)."""
    from backwave.conf import definitions_from_settings  # Django's settings: the sync, not the minting

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
    # Here, not at the top: the executor imports this module for mint_due, and a worker whose
    # project declares no schedule loaded croniter and dateutil (7 ms) before its first claim
    # for slots it never plans.
    from croniter import croniter

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
            logger.error(
                "Schedule %r has a cron expression that cannot be evaluated (%r): %s", schedule.name, schedule.cron, error
            )
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

"""Running the driver's maintenance commands against the store (lease expiry lives in the pump,
next to the other lease operations). Each returns the event that reports it to the driver."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import tzinfo

from backwave.core import commands as cmd
from backwave.core import events as ev
from backwave.store.contract import Store

from .schedules import mint_due

logger = logging.getLogger("backwave.maintenance")


def run_maintenance(store: Store, command: cmd.Command, *, clock: Callable[[], float], tz: tzinfo | None = None) -> ev.Event:
    """Execute one of MintSchedules, PurgeJobs, PurgePumps; the store's errors propagate.

    Cron expressions are evaluated in ``tz``, by default Django's TIME_ZONE.
    """
    match command:
        case cmd.MintSchedules():
            if tz is None:
                from django.utils import timezone

                tz = timezone.get_default_timezone()
            minted = mint_due(store, tz)
            return ev.SchedulesMinted(now=clock(), minted=len(minted))
        case cmd.PurgeJobs():
            purged = store.purge_jobs(older_than=command.retention.job_states, limit=command.limit)
            if purged:
                logger.info("Retention: purged %d finished job(s)", purged)
            return ev.JobsPurged(now=clock(), purged=purged)
        case cmd.PurgePumps():
            purged = store.purge_pumps(older_than=command.older_than)
            if purged:
                logger.info("Forgot %d pump(s) silent for more than %.0f s", purged, command.older_than)
            return ev.PumpsPurged(now=clock(), purged=purged)
    raise TypeError(f"not a maintenance command: {command!r}")

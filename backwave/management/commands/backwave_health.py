"""manage.py backwave_health: the pumps' health as they last reported it, for people and probes.

Prints one line per pump (halted first, with the reason) and one per group, then exits 0 when all
is well and 1 when a group is halted (every one of its pumps is) or a live pump's heartbeat is
stale. A halted pump is never "stale": it stopped heartbeating on purpose and says why.
Heartbeat ages are measured by the database clock, like everything else in BackWave.

Pumps record their health in the database they serve; ``--database`` (repeatable) reads other
databases than ``default``, and a group serving two databases is judged on each of them.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS
from django.db.models import F
from django.db.models.functions import Now

from backwave.databases import database_problem
from backwave.core.health import HALTED
from backwave.models import Pump, worst_status_first
from backwave.shell.health import group_status

class Command(BaseCommand):
    help = "Show pump health; exit 1 when a worker group is halted or a pump's heartbeat is stale."

    def add_arguments(self, parser):
        parser.add_argument("--group", action="append", default=[], help="Only this worker group (repeat for several).")
        parser.add_argument(
            "--database", action="append", default=[],
            help="Read the pumps of this DATABASES alias (repeat for several; default: default).",
        )
        parser.add_argument(
            "--stale-after", type=float, default=None,
            help="Seconds without a heartbeat that make a pump stale (default: each pump's own lease duration).",
        )

    def handle(self, *args, **options):
        stale_after = options["stale_after"]
        if stale_after is not None and not stale_after > 0:
            raise CommandError(f"--stale-after must be a positive number of seconds, got {stale_after}")
        databases = list(dict.fromkeys(options["database"])) or [DEFAULT_DB_ALIAS]
        for database in databases:
            if problem := database_problem(database):
                raise CommandError(f"--database {database!r} {problem}")
        pumps = []
        for database in databases:
            rows = Pump.objects.using(database).annotate(age=Now() - F("last_heartbeat_at"), rank=worst_status_first())
            if options["group"]:
                rows = rows.filter(group__in=options["group"])
            pumps += rows
        # Every row read knows its database (_state.db): the one its pump serves and reports to.
        pumps.sort(key=lambda pump: (pump.rank, pump.group, pump._state.db, pump.worker_id))
        several = len(databases) > 1
        if not pumps:
            where = f" in group(s) {', '.join(options['group'])}" if options["group"] else ""
            raise CommandError(f"No pump has reported its health{where}: no worker is running, or none has started yet.")

        stale = []
        rows = []
        for pump in pumps:
            age = max(0.0, pump.age.total_seconds())
            limit = stale_after if stale_after is not None else pump.lease_duration
            is_stale = pump.status != HALTED and age > limit
            if is_stale:
                stale.append(pump)
            status = f"{pump.status} (stale)" if is_stale else pump.status
            where = (pump._state.db,) if several else ()
            rows.append((*where, pump.group, pump.worker_id, pump.hostname, str(pump.pid), status, str(pump.in_flight), f"{age:.1f}s", pump.reason))
        self._table((*(("DATABASE",) if several else ()), "GROUP", "PUMP", "HOST", "PID", "STATUS", "IN FLIGHT", "HEARTBEAT", "REASON"), rows)

        # A group is judged per database: its pumps on one database cannot take over another's jobs.
        groups: dict[tuple[str, str], list[str]] = {}
        for pump in pumps:
            groups.setdefault((pump.group, pump._state.db), []).append(pump.status)
        verdicts = {key: group_status(statuses) for key, statuses in sorted(groups.items())}
        self.stdout.write("")
        self._table(
            ("GROUP", *(("DATABASE",) if several else ()), "STATUS", "PUMPS"),
            [(name, *((database,) if several else ()), verdict, str(len(groups[name, database]))) for (name, database), verdict in verdicts.items()],
        )

        problems = [
            f"group {name!r} is halted (every pump is{f' on {database!r}' if several else ''})"
            for (name, database), verdict in verdicts.items()
            if verdict == HALTED
        ]
        problems += [f"pump {pump.worker_id} has not sent a heartbeat for {pump.age.total_seconds():.1f}s" for pump in stale]
        if problems:
            raise CommandError("; ".join(problems), returncode=1)

    def _table(self, header, rows) -> None:
        widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
        for row in (header, *rows):
            # The last column (the reason) is not padded: it may be long.
            cells = [str(cell).ljust(width) for cell, width in zip(row[:-1], widths[:-1])] + [str(row[-1])]
            self.stdout.write("  ".join(cells).rstrip())

"""manage.py backwave_health: the pumps' health as they last reported it, for people and probes.

Prints one line per pump (worst first: halted with the reason, lost, stale, degraded, healthy)
and one per group, then one per queue with due jobs that no live pump serves (degraded: "due
for 22 s; no worker serves `emails`"), then exits 0 when all is well and 1 when a group is halted (every one of its
pumps is), a pump is lost (it is not halted and holds no live lease: killed, hung or cut off, its
row still saying what it last reported) or a live pump's heartbeat is stale. A halted pump is
never lost or stale: it stopped heartbeating on purpose and says why. Leases and heartbeat ages
are judged by the database clock, like everything else in BackWave.

Pumps record their health in the database they serve; ``--database`` (repeatable) reads other
databases than ``default``, and a group serving two databases is judged on each of them.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections

from backwave.databases import database_problem
from backwave.core.health import HALTED
from backwave.models import Pump, ShownPumpStatus
from backwave.shell.health import group_status
from backwave.ops import stats
from backwave.store import operator


class Command(BaseCommand):
    help = "Show pump health; exit 1 when a worker group is halted, a pump is lost (no live lease) or its heartbeat is stale."

    def add_arguments(self, parser):
        parser.add_argument("--group", action="append", default=[], help="Only this worker group (repeat for several).")
        parser.add_argument(
            "--database",
            action="append",
            default=[],
            help="Read the pumps of this DATABASES alias (repeat for several; default: default).",
        )
        parser.add_argument(
            "--stale-after",
            type=float,
            default=None,
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
            rows = Pump.objects.using(database).with_shown_status(stale_after)
            if options["group"]:
                rows = rows.filter(group__in=options["group"])
            rows = list(rows)
            # A pump writes its own in_flight only at heartbeats: the job table says how many run now.
            with connections[database].cursor() as cursor:
                in_flight = operator.pumps_in_flight(cursor, [pump.worker_id for pump in rows])
            for pump in rows:
                pump.live_in_flight = in_flight.get(pump.worker_id, 0)
            pumps += rows
        # Every row read knows its database (_state.db): the one its pump serves and reports to.
        pumps.sort(key=lambda pump: (pump.rank, pump.group, pump._state.db, pump.worker_id))
        several = len(databases) > 1
        # Degraded, not failing (as the endpoint has it): the pumps that run may all be fine.
        unserved = [queue for database in databases for queue in stats.unserved_queues(database)]
        if not pumps:
            where = f" in group(s) {', '.join(options['group'])}" if options["group"] else ""
            waiting = "".join(f"; queue {queue.name!r} is {queue.reason}" for queue in unserved)
            raise CommandError(f"No pump has reported its health{where}: no worker is running, or none has started yet{waiting}.")

        stale = []
        lost = []
        rows = []
        for pump in pumps:
            age = max(0.0, pump.age.total_seconds())
            limit = stale_after if stale_after is not None else pump.lease_duration
            is_stale = pump.status != HALTED and age > limit
            if pump.shown_status == ShownPumpStatus.LOST:
                lost.append(pump)
            if is_stale:
                stale.append(pump)
            status = f"{pump.status} (stale)" if is_stale else pump.status
            if pump.shown_status == ShownPumpStatus.LOST:
                status = f"lost: {status}"
            where = (pump._state.db,) if several else ()
            rows.append(
                (
                    *where,
                    pump.group,
                    pump.worker_id,
                    pump.hostname,
                    str(pump.pid),
                    status,
                    str(pump.live_in_flight),
                    f"{age:.1f}s",
                    pump.reason,
                )
            )
        self._table(
            (*(("DATABASE",) if several else ()), "GROUP", "PUMP", "HOST", "PID", "STATUS", "IN FLIGHT", "HEARTBEAT", "REASON"),
            rows,
        )

        # A group is judged per database: its pumps on one database cannot take over another's jobs.
        groups: dict[tuple[str, str], list[str]] = {}
        for pump in pumps:
            groups.setdefault((pump.group, pump._state.db), []).append(pump.status)
        verdicts = {key: group_status(statuses) for key, statuses in sorted(groups.items())}
        self.stdout.write("")
        self._table(
            ("GROUP", *(("DATABASE",) if several else ()), "STATUS", "PUMPS"),
            [
                (name, *((database,) if several else ()), verdict, str(len(groups[name, database])))
                for (name, database), verdict in verdicts.items()
            ],
        )

        if unserved:
            self.stdout.write("")
            self._table(
                ("QUEUE", *(("DATABASE",) if several else ()), "STATUS", "REASON"),
                [(queue.name, *((queue.database,) if several else ()), queue.status, queue.reason) for queue in unserved],
            )

        problems = [
            f"group {name!r} is halted (every pump is{f' on {database!r}' if several else ''})"
            for (name, database), verdict in verdicts.items()
            if verdict == HALTED
        ]
        problems += [f"pump {pump.worker_id} is lost: it holds no live lease (it last reported {pump.status})" for pump in lost]
        problems += [f"pump {pump.worker_id} has not sent a heartbeat for {pump.age.total_seconds():.1f}s" for pump in stale]
        if problems:
            raise CommandError("; ".join(problems), returncode=1)

    def _table(self, header, rows) -> None:
        widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
        for row in (header, *rows):
            # The last column (the reason) is not padded: it may be long.
            cells = [str(cell).ljust(width) for cell, width in zip(row[:-1], widths[:-1])] + [str(row[-1])]
            self.stdout.write("  ".join(cells).rstrip())

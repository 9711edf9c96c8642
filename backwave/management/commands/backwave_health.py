"""manage.py backwave_health: the pumps' health as they last reported it, for people and probes.

Prints one line per pump (halted first, with the reason) and one per group, then exits 0 when all
is well and 1 when a group is halted (every one of its pumps is) or a live pump's heartbeat is
stale. A halted pump is never "stale": it stopped heartbeating on purpose and says why.
Heartbeat ages are measured by the database clock, like everything else in BackWave.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Case, F, IntegerField, Value, When
from django.db.models.functions import Now

from backwave.models import Pump, PumpStatus
from backwave.shell.health import HALTED, group_status

_STATUS_ORDER = Case(
    When(status=PumpStatus.HALTED, then=Value(0)),
    When(status=PumpStatus.DEGRADED, then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


class Command(BaseCommand):
    help = "Show pump health; exit 1 when a worker group is halted or a pump's heartbeat is stale."

    def add_arguments(self, parser):
        parser.add_argument("--group", action="append", default=[], help="Only this worker group (repeat for several).")
        parser.add_argument(
            "--stale-after", type=float, default=None,
            help="Seconds without a heartbeat that make a pump stale (default: each pump's own lease duration).",
        )

    def handle(self, *args, **options):
        stale_after = options["stale_after"]
        if stale_after is not None and not stale_after > 0:
            raise CommandError(f"--stale-after must be a positive number of seconds, got {stale_after}")
        pumps = Pump.objects.annotate(age=Now() - F("last_heartbeat_at"), rank=_STATUS_ORDER).order_by("rank", "group", "worker_id")
        if options["group"]:
            pumps = pumps.filter(group__in=options["group"])
        pumps = list(pumps)
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
            rows.append((pump.group, pump.worker_id, pump.hostname, str(pump.pid), status, str(pump.in_flight), f"{age:.1f}s", pump.reason))
        self._table(("GROUP", "PUMP", "HOST", "PID", "STATUS", "IN FLIGHT", "HEARTBEAT", "REASON"), rows)

        groups: dict[str, list[str]] = {}
        for pump in pumps:
            groups.setdefault(pump.group, []).append(pump.status)
        verdicts = {name: group_status(statuses) for name, statuses in sorted(groups.items())}
        self.stdout.write("")
        self._table(("GROUP", "STATUS", "PUMPS"), [(name, verdict, str(len(groups[name]))) for name, verdict in verdicts.items()])

        problems = [f"group {name!r} is halted (every pump is)" for name, verdict in verdicts.items() if verdict == HALTED]
        problems += [f"pump {pump.worker_id} has not sent a heartbeat for {pump.age.total_seconds():.1f}s" for pump in stale]
        if problems:
            raise CommandError("; ".join(problems), returncode=1)

    def _table(self, header, rows) -> None:
        widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
        for row in (header, *rows):
            # The last column (the reason) is not padded: it may be long.
            cells = [str(cell).ljust(width) for cell, width in zip(row[:-1], widths[:-1])] + [str(row[-1])]
            self.stdout.write("  ".join(cells).rstrip())

"""manage.py backwave_queue: pause, resume or limit a queue, or list the queues' settings.

    manage.py backwave_queue pause emails
    manage.py backwave_queue resume emails
    manage.py backwave_queue limit reports 4     # at most 4 reports jobs running cluster-wide
    manage.py backwave_queue limit reports       # unlimited again
    manage.py backwave_queue list [--json]

``list`` shows every queue the settings declare (TASKS' QUEUES, BACKWAVE["QUEUES"], the worker
groups'), every queue with a row, and every queue that has jobs, with its state, limits and
depths (counted as the Queues page counts them, up to ``COUNT_CAP``). A queue no worker has
written a row for yet shows what its settings will make of it.

Each edits the queue's row (creating it when the queue has none yet) with one statement; workers
read the rows when they claim. The row is written in the database where the queue's jobs live:
that of the BackWave backends that declare the queue in their QUEUES (one with no QUEUES takes
every queue), ``default`` for a queue no backend declares, as the workers read it
(``backwave.databases.queue_databases``). A queue that lives in several databases needs
``--database ALIAS``, which also overrides the choice. ``list`` shows every database BackWave's
backends use (or the one ``--database`` names), each queue under the databases it lives in or
has rows or jobs in. The command only validates and hands over to
``backwave.ops.actions``, which the admin's actions use too.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from backwave import conf
from backwave.databases import console_databases, not_a_console_database, queue_databases
from backwave.ops import actions, stats
from backwave.queue_rules import MAX_CONCURRENCY_LIMIT, parse_concurrency_limit, validate_queue_name


class Command(BaseCommand):
    help = "Pause, resume or set the concurrency limit of a queue; or list the queues, with their settings and depths."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{pause,resume,limit,list}")
        for name, text in (
            ("pause", "Stop claiming from the queue (running jobs finish)."),
            ("resume", "Claim from the queue again."),
        ):
            command = sub.add_parser(name, help=text)
            command.add_argument("names", nargs="+", metavar="NAME", help="Queue name(s).")
            database_option(command)
        limit = sub.add_parser("limit", help="Set the queue's cluster-wide concurrency limit; without N, unlimited.")
        limit.add_argument("names", nargs=1, metavar="NAME")
        limit.add_argument(
            "limit",
            nargs="?",
            default=None,
            metavar="N",
            help=f"A whole number from 1 to {MAX_CONCURRENCY_LIMIT:,}; leave out (or 'none') for unlimited.",
        )
        database_option(limit)
        listing = sub.add_parser("list", help="Show every declared or used queue: paused or not, its limits and its depths.")
        listing.add_argument("--json", action="store_true", help="JSON on stdout instead of a table.")
        database_option(listing, "Only this database (a DATABASES alias a BackWave backend enqueues into); default: every one.")

    def handle(self, *args, action, **options):
        database = options.get("database")
        databases = console_databases()
        if database is not None and database not in databases:
            raise CommandError(f"--database {not_a_console_database(database, databases)}")
        if action == "list":
            return self._list(options["json"], [database] if database else databases)
        names = options["names"]
        try:
            for name in names:
                validate_queue_name(name)
            homes = self._homes(names, database)
            limit = self._parse_limit(options["limit"]) if action == "limit" else None
        except ValueError as error:
            raise CommandError(str(error)) from error
        for alias, here in homes.items():
            if action == "pause":
                actions.pause_queues(here, using=alias)
            elif action == "resume":
                actions.resume_queues(here, using=alias)
            else:
                actions.limit_queues(here, limit, using=alias)
        where = f" Written in database {' and '.join(map(repr, homes))}." if len(databases) > 1 else ""
        if action == "pause":
            self.stdout.write(f"Paused {', '.join(names)}: workers stop claiming from it; running jobs finish.{where}")
        elif action == "resume":
            self.stdout.write(f"Resumed {', '.join(names)}.{where}")
        else:
            shown = "unlimited" if limit is None else f"at most {limit} running at once, cluster-wide"
            self.stdout.write(f"{names[0]}: {shown}.{where}")

    @staticmethod
    def _homes(names, database: str | None) -> dict[str, list[str]]:
        """database -> the names whose rows it gets; every name checked before anything is written."""
        if database is not None:
            return {database: list(names)}
        homes: dict[str, list[str]] = {}
        for name in names:
            found = queue_databases(name)
            if len(found) > 1:
                raise CommandError(
                    f"Queue {name!r} lives in databases {', '.join(found[:-1])} and {found[-1]}: name one with --database "
                    "(its jobs are in each; a worker reads the row of the database it claims from)."
                )
            homes.setdefault(found[0], []).append(name)
        return homes

    @staticmethod
    def _parse_limit(raw):
        return parse_concurrency_limit(raw or "", unlimited="leave it out")

    def _list(self, as_json: bool, databases: list[str]):
        several = len(console_databases()) > 1
        declared = conf.declared_queues()
        settings_queues = conf.get_setting("QUEUES")
        rows = []
        for alias in databases:
            with stats.without_jit(alias):
                lines = stats.queue_lines(stats.table_statistics(alias), alias)
            if several:
                lines = stats.lines_living_in(lines, alias)
            rows += [
                {"database": alias, **queue_row(line, declared.get(line.name, []), settings_queues.get(line.name))}
                for line in lines
            ]
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        cells = [
            [
                *([row["database"]] if several else []),
                row["queue"],
                row["state"],
                shown(row["concurrency_limit"]),
                shown(row["key_concurrency_limit"]),
                row["rate"] or "-",
                *(f"{row[state]:,}{'+' if state in row['at_least'] else ''}" for state in stats.QUEUE_LINE_STATES),
                ", ".join(row["declared_in"]) or "(jobs or a row only)",
            ]
            for row in rows
        ]
        header = [
            *(["DATABASE"] if several else []),
            "QUEUE",
            "STATE",
            "LIMIT",
            "PER-KEY",
            "RATE",
            *(s.upper() for s in stats.QUEUE_LINE_STATES),
            "DECLARED IN",
        ]
        widths = (
            [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(header)] if cells else [len(h) for h in header]
        )
        for line in [header, *cells]:
            self.stdout.write("  ".join(value.ljust(width) for value, width in zip(line, widths, strict=True)).rstrip())
        if any(not row["has_row"] and row["declared_in"] for row in rows):
            self.stdout.write(
                "Queues without a row yet show their settings: a worker writes them when it starts; pause and limit write one now."
            )


def database_option(parser, text: str | None = None) -> None:
    parser.add_argument(
        "--database",
        metavar="ALIAS",
        help=text
        or "Write the row in this database (a DATABASES alias a BackWave backend enqueues into); needed for a queue that lives in several.",
    )


def shown(value) -> str:
    return "-" if value is None else f"{value:,}"


def queue_row(line: stats.QueueLine, declared_in: list[str], spec) -> dict:
    """One queue as ``list`` shows it: its row's values, or (no row yet) its settings'."""
    if not line.has_row and spec:
        admission = conf.admission_limits(spec)
        line = stats.QueueLine(
            name=line.name,
            has_row=False,
            concurrency_limit=spec.get("concurrency_limit"),
            paused=bool(spec.get("paused")),
            counts=line.counts,
            **admission,
        )
    return {
        "queue": line.name,
        "state": "paused" if line.paused else "active",
        "concurrency_limit": line.concurrency_limit,
        "key_concurrency_limit": line.key_concurrency_limit,
        "rate": line.rate_shown,
        **{state: count.value for state, count in line.counts.items()},
        "at_least": [state for state, count in line.counts.items() if count.capped],
        "has_row": line.has_row,
        "declared_in": declared_in,
    }

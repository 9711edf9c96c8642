"""manage.py backwave_jobs: list, show, retry, cancel or purge jobs from a shell.

    manage.py backwave_jobs list --state failed --queue emails --older-than 1h
    manage.py backwave_jobs list --search "customer_id=42 tag:vip" --json
    manage.py backwave_jobs show 1234
    manage.py backwave_jobs retry --state failed --task shop.tasks.send_receipt --yes
    manage.py backwave_jobs cancel --id 17 --id 18 --as-user alice
    manage.py backwave_jobs purge --state succeeded --older-than 7d --yes

Who may act: the command runs with the shell's rights, like ``manage.py shell``: whoever can
run it can read the settings and the database password anyway, so without ``--as-user`` it is
not limited, and what it does is logged (logger ``backwave.operator``) with the OS user's name.
``--as-user USERNAME`` applies the admin's rules for that Django user instead (active staff,
``backwave.view_job`` to read, and with it ``retry_job`` / ``cancel_job`` to act, ``delete_job`` to purge)
and records each change in the admin's history under that user, as the admin does (where
``django.contrib.admin`` is installed).

Several databases: BackWave's backends may enqueue into different databases, and the command
covers every one of them (``backwave.databases.console_databases``) unless ``--database ALIAS``
names one. Job ids are per database, so each row says where it lives when there are several;
``list`` merges the databases' pages newest first, ``show`` asks for ``--database`` when the id
exists in more than one, and an action reports what it did in each.

Retry, cancel and purge act through ``backwave.ops.actions`` (the admin's statements too), in
batches of ``actions.BATCH_SIZE`` each committed on its own; they refuse to run with no filter
at all unless given ``--all``, and ask for confirmation unless given ``--yes``.
"""

from __future__ import annotations

import getpass
import heapq
import json
import logging
import sys
from itertools import islice

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q
from django.utils import timezone

from backwave.databases import console_databases, not_a_console_database
from backwave.management import arguments
from backwave.models import Attempt, Job, JobState
from backwave.ops import actions
from backwave.ops import search as job_search
from backwave.ops.stats import COUNT_CAP
from backwave.ops.formatting import attempt_row
from backwave.ops.history import history_note, record_history
from backwave.ops.redaction import redacted
from backwave.ops.tracebacks import error_message

logger = logging.getLogger("backwave.operator")

PERMISSIONS = {"list": "view_job", "show": "view_job", "retry": "retry_job", "cancel": "cancel_job", "purge": "delete_job"}
PAST = {"retry": "retried", "cancel": "cancelled", "purge": "purged"}
APPLIES = {"retry": "failed, quarantined or held", "cancel": "ready, scheduled, waiting or held", "purge": "finished"}
LIST_COLUMNS = ("id", "database", "state", "queue", "task", "attempts", "enqueued", "finished", "worker", "last_error")


class Command(BaseCommand):
    help = "List, show, retry, cancel or purge BackWave jobs (filters: queue, task, state, age, tag, search)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True, metavar="{list,show,retry,cancel,purge}")
        texts = {
            "list": "List jobs matching the filters, newest first.",
            "retry": "Make matching failed, quarantined or held jobs ready now, with one more attempt.",
            "cancel": "Cancel matching ready (due or scheduled), waiting or held jobs (their dependents follow their on_failure); running ones are left alone.",
            "purge": "Delete matching finished jobs (succeeded, failed, cancelled, quarantined) and their attempts.",
        }
        for verb, text in texts.items():
            command = sub.add_parser(verb, help=text, description=text)
            self._filters(command)
            if verb == "list":
                command.add_argument(
                    "--limit",
                    type=arguments.limit,
                    default=50,
                    help=f"At most this many rows (default 50, at most {arguments.MAX_LIMIT:,}).",
                )
                command.add_argument(
                    "--offset", type=arguments.offset, default=0, help="Skip this many rows first (default 0), to page on."
                )
            else:
                command.add_argument("--all", action="store_true", help="Allow acting with no filter at all.")
                command.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")
                command.add_argument("--dry-run", action="store_true", help="Only say how many jobs it would change.")
            self._common(command)
        show = sub.add_parser("show", help="One job with its payload (sensitive keys hidden) and every attempt.")
        show.add_argument("job_id", type=arguments.job_id, metavar="ID")
        self._common(show)

    @staticmethod
    def _filters(parser):
        parser.add_argument(
            "--id", dest="ids", type=arguments.job_id, action="append", default=[], metavar="ID", help="A job id (repeatable)."
        )
        parser.add_argument("--queue", dest="queues", action="append", default=[], metavar="QUEUE", help="Repeatable.")
        parser.add_argument(
            "--task", dest="tasks", action="append", default=[], metavar="PATH", help="A task's import path (repeatable)."
        )
        parser.add_argument(
            "--state",
            dest="states",
            action="append",
            default=[],
            metavar="STATE",
            choices=[*JobState.values, "scheduled"],
            help="ready, scheduled, running, succeeded, failed, cancelled, quarantined (repeatable).",
        )
        parser.add_argument(
            "--tag",
            dest="tags",
            action="append",
            default=[],
            metavar="TAG",
            help="Jobs carrying this tag (repeatable: all of them).",
        )
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            type=arguments.age,
            help="Finished jobs: finished more than AGE ago; others: enqueued more than AGE ago (30m, 2h, 7d; at most 100 years).",
        )
        parser.add_argument(
            "--search", metavar="TEXT", help="The admin's search: key=value, arg:value, tag:name, an id or part of a task path."
        )

    @staticmethod
    def _common(parser):
        parser.add_argument("--json", action="store_true", help="JSON on stdout instead of a table.")
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="Only this database (a DATABASES alias a BackWave backend enqueues into); default: every one of them.",
        )
        parser.add_argument(
            "--as-user",
            metavar="USERNAME",
            help="Apply the admin's permission checks for this Django user, and record changes under their name.",
        )

    # --- entry ------------------------------------------------------------------------------

    def handle(self, *args, verb, **options):
        self._coerce(options)
        user = self._user(options.get("as_user"), verb)
        databases = self._databases(options.get("database"))
        if verb == "show":
            return self._show(options["job_id"], databases, options)
        queryset, described = self._queryset(options)
        if verb == "list":
            return self._list(queryset, databases, options)
        return self._act(verb, queryset, described, user, databases, options)

    @staticmethod
    def _databases(alias) -> list[str]:
        databases = console_databases()
        if alias is None:
            return databases
        if alias not in databases:
            raise CommandError(f"--database {not_a_console_database(alias, databases)}")
        return [alias]

    @staticmethod
    def _coerce(options):
        """The parser's bounds on what call_command() passed as keywords (they skip the parser)."""
        for key, option, kind in (
            ("limit", "--limit", arguments.limit),
            ("offset", "--offset", arguments.offset),
            ("job_id", "ID", arguments.job_id),
        ):
            if key in options:
                options[key] = arguments.coerce(option, kind, options[key])
        options["ids"] = [arguments.coerce("--id", arguments.job_id, value) for value in options.get("ids") or ()]
        if options.get("older_than") is not None:
            options["older_than"] = arguments.coerce("--older-than", arguments.age, options["older_than"])

    def _user(self, username, verb):
        if not username:
            return None
        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(username)
        except model.DoesNotExist:
            raise CommandError(f"--as-user {username!r}: no such user.") from None
        if not (user.is_active and user.is_staff):
            raise CommandError(f"--as-user {username!r}: only active staff users may use the admin, and so this command.")
        # Acting needs view_job too, as in the admin: the command says how many jobs match a
        # filter or search, which would otherwise tell argument values to a user who may not list jobs.
        for permission in dict.fromkeys(("backwave.view_job", f"backwave.{PERMISSIONS[verb]}")):
            if not user.has_perm(permission):
                raise CommandError(
                    f"--as-user {username!r} lacks the permission {permission!r} that {verb!r} needs (as in the admin)."
                )
        return user

    def _queryset(self, options):
        for option in ("queues", "tasks", "tags"):
            for value in options[option]:
                try:
                    job_search.check_text(value, f"--{option[:-1]} {value!r}")
                except job_search.SearchError as error:
                    raise CommandError(str(error)) from None
        queryset = Job.objects.all()
        described = []
        if options["ids"]:
            queryset = queryset.filter(id__in=options["ids"])
            described.append(f"id in {options['ids']}")
        if options["queues"]:
            queryset = queryset.filter(queue__in=options["queues"])
            described.append(f"queue in {options['queues']}")
        if options["tasks"]:
            queryset = queryset.filter(task_path__in=options["tasks"])
            described.append(f"task in {options['tasks']}")
        if states := options["states"]:
            now = timezone.now()
            condition = Q()
            for state in states:
                if state == "ready":  # as in the admin: ready means due; scheduled is ready for later
                    condition |= Q(state="ready", run_at__lte=now)
                elif state == "scheduled":
                    condition |= Q(state="ready", run_at__gt=now)
                else:
                    condition |= Q(state=state)
            queryset = queryset.filter(condition)
            described.append(f"state in {states}")
        if options["tags"]:
            queryset = queryset.filter(job_search.tags_condition(options["tags"]))
            described.append(f"tags {options['tags']}")
        if options["older_than"] is not None:
            cut = timezone.now() - options["older_than"]
            queryset = queryset.filter(Q(finished_at__lt=cut) | Q(finished_at__isnull=True, enqueued_at__lt=cut))
            described.append(f"older than {options['older_than']}")
        if options["search"]:
            try:
                queryset = job_search.parse(options["search"]).apply(queryset)
            except job_search.SearchError as error:
                raise CommandError(f"--search: {error}") from None
            described.append(f"search {options['search']!r}")
        return queryset, ", ".join(described)

    # --- reading ----------------------------------------------------------------------------

    def _list(self, queryset, databases, options):
        offset, limit = options["offset"], options["limit"]
        several = len(databases) > 1
        if several and offset + limit > arguments.MAX_LIMIT:
            # Each database's page starts at its newest job: paging past offset reads it all.
            raise CommandError(
                f"--offset {offset:,} with --limit {limit:,} would read {offset + limit:,} jobs from each of {len(databases)} "
                f"databases (at most {arguments.MAX_LIMIT:,} across several): name one with --database to page further."
            )
        pages = []
        for alias in databases:
            page = queryset.using(alias).defer("payload", "return_value").order_by("-id")
            jobs = list(page[: offset + limit] if several else page[offset : offset + limit])
            errors = self._last_errors(alias, [job.pk for job in jobs])
            pages.append([(job, errors.get(job.pk, ("", ""))) for job in jobs])
        if several:
            # Ids are per database: newest first is by enqueue time across them.
            merged = heapq.merge(*pages, key=lambda item: (item[0].enqueued_at, item[0].pk), reverse=True)
            chosen = list(islice(merged, offset, offset + limit))
        else:
            chosen = pages[0]
        rows = [self._row(job, error) for job, error in chosen]
        note = self._page_note([queryset.using(alias) for alias in databases], offset, limit, len(rows))
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False))
            if note:  # stdout stays one JSON document
                self.stderr.write(note)
            return
        if not rows:
            self.stdout.write(note or "No job matches.")
            return
        columns = LIST_COLUMNS if several else tuple(c for c in LIST_COLUMNS if c != "database")
        self.stdout.write(
            table([{**row, "enqueued": local(row["enqueued"]), "finished": local(row["finished"])} for row in rows], columns)
        )
        if note:
            self.stdout.write(note)

    @staticmethod
    def _page_note(querysets, offset: int, limit: int, shown: int) -> str:
        """What the page leaves out, or "" when it shows every match. The total is counted only
        when the page does not tell it, and only up to COUNT_CAP + 1 rows (never the whole table)."""
        if offset == 0 and shown < limit:
            return ""
        if 0 < shown < limit:
            total, capped = offset + shown, False
        else:
            total = sum(queryset.order_by().values("id")[: COUNT_CAP + 1].count() for queryset in querysets)
            total, capped = min(total, COUNT_CAP), total > COUNT_CAP
        if offset == 0 and not capped and total == shown:
            return ""
        counted = f"more than {total:,}" if capped else f"{total:,}"
        if not shown:
            return f"No job at --offset {offset:,}: {counted} match."
        text = f"Showing {offset + 1:,}-{offset + shown:,} of {counted} matching jobs, newest first"
        if capped or offset + shown < total:
            return f"{text}: --offset {offset + shown} shows the next {limit:,} (or give a larger --limit)."
        return f"{text}."

    @staticmethod
    def _last_errors(database: str, job_ids) -> dict[int, tuple[str, str]]:
        """job id -> (error class, message) of its latest attempt: one query per database."""
        if not job_ids:
            return {}
        latest = (
            Attempt.objects.using(database)
            .filter(job_id__in=job_ids)
            .order_by("job_id", "-number")
            .distinct("job_id")
            .values_list("job_id", "error_class", "traceback")
        )
        return {job_id: (cls, error_message(cls, text) if cls else "") for job_id, cls, text in latest}

    @staticmethod
    def _row(job, error) -> dict:
        error_class, message = error
        return {
            "id": job.pk,
            "database": job._state.db,
            "state": job.state,
            "queue": job.queue,
            "task": job.task_path,
            "attempts": f"{job.attempts}/{job.max_attempts}",
            "tags": job.tags,
            "enqueued": iso(job.enqueued_at),
            "started": iso(job.last_attempted_at),
            "finished": iso(job.finished_at),
            "worker": job.worker_id,
            "last_error": f"{error_class.rsplit('.', 1)[-1]}: {message}" if error_class else "",
        }

    def _show(self, job_id, databases, options):
        found = [job for alias in databases if (job := Job.objects.using(alias).filter(pk=job_id).first()) is not None]
        if not found:
            raise CommandError(f"No job {job_id}" + (f" in databases {and_list(databases)}." if len(databases) > 1 else "."))
        if len(found) > 1:
            raise CommandError(
                f"Job {job_id} exists in databases {and_list([job._state.db for job in found])}: name one with --database."
            )
        (job,) = found
        attempts = [attempt_row(a) for a in Attempt.objects.using(job._state.db).filter(job_id=job_id).order_by("number")]
        document = {
            **self._row(job, ("", "")),
            "priority": job.priority,
            "run_at": iso(job.run_at),
            # Everything derived from the arguments or the handler, as the admin shows it.
            **{
                field: redacted(job, field)
                for field in ("payload", "return_value", "output", "progress", "metadata", "unique_key", "limit_key")
            },
            "attempts_log": [
                {
                    "number": row["attempt"].number,
                    "outcome": row["attempt"].state,
                    "worker": row["attempt"].worker_id,
                    "started": iso(row["attempt"].started_at),
                    "ran_until": iso(row["ran_until"]),
                    "duration_seconds": row["duration"],
                    "error_class": row["attempt"].error_class,
                    "error_message": row["error_message"],
                    "return_value": json.loads(row["return_value"]) if row["return_value"] is not None else None,
                }
                for row in attempts
            ],
        }
        del document["last_error"]
        if options["json"]:
            self.stdout.write(json.dumps(document, indent=2, ensure_ascii=False))
            return
        for key in (
            "id",
            *(("database",) if len(console_databases()) > 1 else ()),
            "task",
            "state",
            "queue",
            "priority",
            "attempts",
            "tags",
            "worker",
            "enqueued",
            "run_at",
            "started",
            "finished",
        ):
            value = document[key]
            self.stdout.write(f"{key:>10}: {local(value) if key in ('enqueued', 'run_at', 'started', 'finished') else value}")
        self.stdout.write(f"{'payload':>10}: {json.dumps(document['payload'], ensure_ascii=False)}")
        if job.return_value is not None:
            self.stdout.write(f"{'result':>10}: {json.dumps(document['return_value'], ensure_ascii=False)}")
        for key, label in (
            ("output", "output"),
            ("progress", "progress"),
            ("metadata", "metadata"),
            ("unique_key", "unique"),
            ("limit_key", "limit key"),
        ):
            if document[key] is not None:
                value = document[key] if isinstance(document[key], str) else json.dumps(document[key], ensure_ascii=False)
                self.stdout.write(f"{label:>10}: {value}")
        for item in document["attempts_log"]:
            error = f"  {item['error_class']}: {item['error_message']}" if item["error_class"] else ""
            duration = "-" if item["duration_seconds"] is None else f"{item['duration_seconds']:.3f} s"
            self.stdout.write(
                f"  attempt {item['number']}: {item['outcome']} on {item['worker']} at {local(item['started'])} ({duration}){error}"
            )

    # --- acting -----------------------------------------------------------------------------

    def _act(self, verb, queryset, described, user, databases, options):
        if not described and not options["all"]:
            raise CommandError(f"{verb} with no filter would touch every {APPLIES[verb]} job: add filters, or --all to mean it.")
        several = len(databases) > 1
        counted = {alias: queryset.using(alias).filter(state__in=actions.ALLOWED_STATES[verb]).count() for alias in databases}
        matching = sum(counted.values())
        what = (
            f"{matching:,} {APPLIES[verb]} job{'' if matching == 1 else 's'}"
            + (f" matching {described}" if described else "")
            + (f" ({per_database(found)})" if several and (found := {a: n for a, n in counted.items() if n}) else "")
        )
        if options["dry_run"] or not matching:
            self._say(
                options,
                {"verb": verb, "matching": matching, "changed": 0, "dry_run": options["dry_run"]},
                f"Would {verb} {what}." if options["dry_run"] else f"Nothing to {verb}: no {APPLIES[verb]} job matches.",
            )
            return
        if not options["yes"]:
            if not sys.stdin.isatty():
                raise CommandError(f"This would {verb} {what}; add --yes to confirm when not at a terminal.")
            if input(f"{verb.capitalize()} {what}? [y/N] ").strip().lower() not in ("y", "yes"):
                raise CommandError("Nothing done.")
        note = f" by manage.py backwave_jobs {verb}" + (f" ({described})" if described else "")
        who = f"Django user {user.get_username()!r}" if user is not None else f"OS user {getpass.getuser()!r} (no --as-user)"
        results = {}
        for alias in databases:
            # Ids are per database: the history says which one a job was in (history_note).
            where = note + history_note(alias)
            on_batch = (lambda result, where=where: record_history(user, verb, result, where)) if user is not None else None
            results[alias] = result = actions.act_on_matching(queryset.using(alias), verb, on_batch=on_batch)
            logger.info(
                "backwave_jobs %s by %s: %d job(s) %s%s%s",
                verb,
                who,
                len(result.changed),
                PAST[verb],
                f" ({described})" if described else "",
                f" in database {alias!r}" if several else "",
            )
        total = sum(results.values(), actions.JobActionResult())
        refused = ", ".join(f"{n} {state}" for state, n in sorted(total.refused.items()))
        text = (
            f"{PAST[verb].capitalize()} {len(total.changed):,} job{'' if len(total.changed) == 1 else 's'}"
            + (
                f" ({per_database(changed)})"
                if several and (changed := {a: len(r.changed) for a, r in results.items() if r.changed})
                else ""
            )
            + (f"; left alone, having moved on meanwhile: {refused}" if refused else "")
            + "."
        )
        document = {
            "verb": verb,
            "matching": matching,
            "changed": len(total.changed),
            "ids": list(total.changed),
            "refused": dict(total.refused),
            "batches": total.batches,
        }
        if several:
            document["databases"] = {
                alias: {"matching": counted[alias], "changed": len(result.changed), "ids": list(result.changed)}
                for alias, result in results.items()
            }
        self._say(options, document, text)

    def _say(self, options, document, text):
        self.stdout.write(json.dumps(document) if options["json"] else text)


def and_list(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def per_database(numbers: dict[str, int]) -> str:
    return ", ".join(f"{alias}: {number:,}" for alias, number in numbers.items())


def iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def local(text) -> str:
    """An ISO time as the table shows it: in Django's current zone, to the second, zone named."""
    if not text:
        return "-"
    from datetime import datetime

    moment = timezone.localtime(datetime.fromisoformat(text))
    return f"{moment:%Y-%m-%d %H:%M:%S} {timezone.get_current_timezone_name()}"


def table(rows: list[dict], columns) -> str:
    """Plain aligned columns; the last one (the error) is cut to keep lines readable."""
    cells = [[str(row[c] if row[c] is not None else "-") for c in columns] for row in rows]
    cells = [[*line[:-1], line[-1][:80]] for line in cells]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    header = "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    return "\n".join([header.rstrip(), *body])

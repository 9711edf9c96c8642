"""manage.py backwave_cancel JOB_ID [JOB_ID ...]: cancel jobs by id, as the admin's Cancel does.

A ready (due or scheduled) job, or a workflow's waiting or held one, is cancelled at once; a running one is asked to stop (its worker
is told within moments and ends it cancelled), unless ``--ready-only``. Prints what it did per
job; exits with an error when a job does not exist.
"""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections

from backwave.management import arguments
from backwave.ops import actions


class Command(BaseCommand):
    help = "Cancel jobs by id: ready ones at once, running ones by asking their worker to stop them."

    def add_arguments(self, parser):
        parser.add_argument("job_ids", nargs="+", type=arguments.job_id, metavar="JOB_ID")
        parser.add_argument("--ready-only", action="store_true", help="Leave running jobs alone.")
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="The DATABASES alias the jobs live in (default: default)."
        )
        parser.add_argument(
            "--by",
            default=None,
            type=arguments.cancelled_by,
            help="Who cancels, as the attempt's error names it: 1 to 255 characters (default: command:<your login>).",
        )

    def handle(self, *args, job_ids, ready_only, database, by, **options):
        if database not in connections:
            raise CommandError(f"--database {database!r} is not in DATABASES ({', '.join(connections)}).")
        job_ids = [arguments.coerce("JOB_ID", arguments.job_id, value) for value in job_ids]
        if by is None:
            try:
                by = arguments.cancelled_by(f"command:{getpass.getuser()}"[: arguments.MAX_BY_LENGTH])
            except Exception:  # no login name (a container without a passwd entry), or one the column cannot hold
                by = "command"
        by = arguments.coerce("--by", arguments.cancelled_by, by)
        result = actions.cancel_job_ids(job_ids, by=by, running=not ready_only, using=database)
        asked = set(result.requested)
        for job_id in sorted(set(result.changed) - asked):
            self.stdout.write(f"job {job_id}: cancelled")
        for job_id in sorted(asked):
            self.stdout.write(f"job {job_id}: running; its worker was asked to stop it, and ends it cancelled")
        for state, count in sorted(result.refused.items()):
            self.stdout.write(f"{count} job(s) left alone: {state}")
        if result.gone:
            raise CommandError(f"no such job: {', '.join(map(str, result.gone))}")

"""manage.py backwave_queue: pause, resume or limit a queue, or list the queues' settings.

    manage.py backwave_queue pause emails
    manage.py backwave_queue resume emails
    manage.py backwave_queue limit reports 4     # at most 4 reports jobs running cluster-wide
    manage.py backwave_queue limit reports       # unlimited again
    manage.py backwave_queue list

Each edits the queue's row (creating it when the queue has none yet) with one statement; workers
read the rows when they claim. The command only validates and hands over to
``backwave.ops.actions``, which the admin's actions use too.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from backwave.ops import actions
from backwave.models import Queue
from backwave.queue_rules import MAX_CONCURRENCY_LIMIT, parse_concurrency_limit, validate_queue_name


class Command(BaseCommand):
    help = "Pause, resume or set the concurrency limit of a queue; or list the queues' rows."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{pause,resume,limit,list}")
        for name, text in (("pause", "Stop claiming from the queue (running jobs finish)."), ("resume", "Claim from the queue again.")):
            command = sub.add_parser(name, help=text)
            command.add_argument("names", nargs="+", metavar="NAME", help="Queue name(s).")
        limit = sub.add_parser("limit", help="Set the queue's cluster-wide concurrency limit; without N, unlimited.")
        limit.add_argument("names", nargs=1, metavar="NAME")
        limit.add_argument("limit", nargs="?", default=None, metavar="N", help=f"A whole number from 1 to {MAX_CONCURRENCY_LIMIT:,}; leave out (or 'none') for unlimited.")
        sub.add_parser("list", help="Show every queue row: limit and paused.")

    def handle(self, *args, action, **options):
        if action == "list":
            return self._list()
        names = options["names"]
        try:
            for name in names:
                validate_queue_name(name)
            if action == "pause":
                actions.pause_queues(names)
                self.stdout.write(f"Paused {', '.join(names)}: workers stop claiming from it; running jobs finish.")
            elif action == "resume":
                actions.resume_queues(names)
                self.stdout.write(f"Resumed {', '.join(names)}.")
            else:
                limit = self._parse_limit(options["limit"])
                actions.limit_queues(names, limit)
                shown = "unlimited" if limit is None else f"at most {limit} running at once, cluster-wide"
                self.stdout.write(f"{names[0]}: {shown}.")
        except ValueError as error:
            raise CommandError(str(error)) from error

    @staticmethod
    def _parse_limit(raw):
        return parse_concurrency_limit(raw or "", unlimited="leave it out")

    def _list(self):
        rows = list(Queue.objects.order_by("name"))
        if not rows:
            self.stdout.write("No queue rows: every queue is unpaused and unlimited.")
            return
        for queue in rows:
            limit = "unlimited" if queue.concurrency_limit is None else f"limit {queue.concurrency_limit}"
            self.stdout.write(f"{queue.name}\t{limit}\t{'paused' if queue.paused else 'active'}")

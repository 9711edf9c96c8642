"""``manage.py embedded_db start|stop|status``: control the embedded PostgreSQL in .pgdata/.

``stop --unless-in-use`` leaves the server running while other sessions use it (what bin/run
asks at its end, so a test run or a shell sharing the server keeps it). ``status`` exits 0 when the server runs and 3 when it does not (as ``pg_ctl status`` does), so
scripts can ask before they start it and stop only what they started.
"""

import os
import shlex
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from project import database


class Command(BaseCommand):
    help = "Start, stop or report the embedded PostgreSQL server (used when DATABASE_URL is not set)."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "status"])
        parser.add_argument(
            "--unless-in-use",
            action="store_true",
            help="stop: leave the server running, and say so, while other sessions are connected to it.",
        )

    def handle(self, *args, action, unless_in_use=False, **options):
        if action == "stop":
            self.handle_stop(unless_in_use=unless_in_use)
        else:
            getattr(self, f"handle_{action}")()

    def handle_start(self):
        if os.environ.get("DATABASE_URL"):
            raise CommandError("DATABASE_URL is set, so the project does not use the embedded server; unset it first.")
        info = database.embedded_server().get_postmaster_info()
        self.stdout.write(
            f"embedded PostgreSQL running: pid {info.pid}, socket {info.socket_dir}, data {database.EMBEDDED_DATA_DIR}"
        )

    def handle_stop(self, unless_in_use=False):
        if unless_in_use and (sessions := database.embedded_client_sessions()):
            self.stdout.write(
                f"embedded PostgreSQL left running: {sessions} other session(s) still use it "
                f"(data {database.EMBEDDED_DATA_DIR}); stop it with: {stop_command()}"
            )
            return
        try:
            stopped = database.stop_embedded_server()
        except Exception as exc:  # pg_ctl's failure: CalledProcessError or TimeoutExpired
            raise CommandError(f"could not stop the embedded PostgreSQL in {database.EMBEDDED_DATA_DIR}: {exc}") from exc
        if stopped:
            self.stdout.write(f"embedded PostgreSQL stopped (data {database.EMBEDDED_DATA_DIR})")
        else:
            self.stdout.write(f"embedded PostgreSQL was not running (data {database.EMBEDDED_DATA_DIR})")

    def handle_status(self):
        info = database.embedded_server_info()
        if info is None:
            self.stdout.write(f"embedded PostgreSQL stopped (data {database.EMBEDDED_DATA_DIR})")
            sys.exit(3)
        note = " (not in use: DATABASE_URL is set)" if os.environ.get("DATABASE_URL") else ""
        self.stdout.write(
            f"embedded PostgreSQL running: pid {info.pid}, socket {info.socket_dir}, data {database.EMBEDDED_DATA_DIR}{note}"
        )


def stop_command() -> str:
    """The shell command that stops this server from any directory, with or without the
    virtualenv activated: this interpreter and manage.py by their absolute paths, and the data
    folder when it is not the default one."""
    data = database.EMBEDDED_DATA_DIR.expanduser().resolve()
    where = f"BACKWAVE_PGDATA={shlex.quote(str(data))} " if os.environ.get("BACKWAVE_PGDATA") else ""
    python = shlex.quote(str(Path(sys.executable).absolute()))
    return f"{where}{python} {shlex.quote(str(database.BASE_DIR / 'manage.py'))} embedded_db stop"

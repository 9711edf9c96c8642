"""manage.py backwave_worker: run BackWave's worker groups in this process."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from backwave import conf, operations
from backwave.core.options import Retention, WorkerGroupConfigError
from backwave.shell.registry import TaskRegistry
from backwave.shell.supervisor import Supervisor
from backwave.shell.worker import Worker, group_from_mapping

logger = logging.getLogger("backwave.worker")


class Command(BaseCommand):
    help = "Run BackWave worker groups: claim jobs, run them, report outcomes. SIGTERM or SIGINT drains; a second signal stops at once."

    def add_arguments(self, parser):
        parser.add_argument("--queues", help="Comma-separated queues for a one-off group (instead of BACKWAVE['WORKER_GROUPS']).")
        parser.add_argument("--group", default=None, help="Run only this configured group, or name the one-off group (default 'cli').")
        parser.add_argument("--pool-size", type=int, help="Worker threads per pump.")
        parser.add_argument("--pumps", type=int, help="Pumps (claim loops) per group.")
        parser.add_argument("--max-claim-batch", type=int)
        parser.add_argument("--poll-interval", type=float, help="Seconds between polls when idle.")
        parser.add_argument("--lease-duration", type=float, help="Seconds a lease lives without renewal.")
        parser.add_argument("--maintenance-interval", type=float)
        parser.add_argument("--drain-timeout", type=float, help="Seconds running jobs get to finish after SIGTERM.")
        parser.add_argument("--until-idle", action="store_true", help="Drain and exit once no due job is left (for scripts and tests).")
        parser.add_argument("--processes", type=int, default=1, help="Run this many worker processes under a supervisor (CPU-bound tasks).")
        parser.add_argument("--no-hints", action="store_true", help="Do not LISTEN for wake-up hints: poll only.")
        parser.add_argument("--log-every", type=float, default=10.0, help="Seconds between throughput lines.")
        parser.add_argument(
            "--health-port", type=int, default=None,
            help="Serve the health endpoint on this port (200 healthy or degraded, 503 when a group is halted; 0 picks a free port).",
        )
        parser.add_argument("--health-host", default="127.0.0.1", help="Address the health endpoint binds to (default 127.0.0.1).")

    def handle(self, *args, **options):
        if options["verbosity"] >= 2:
            logging.getLogger("backwave").setLevel(logging.DEBUG)
        if options["processes"] != 1:
            if options["health_port"]:
                raise CommandError(
                    f"--health-port {options['health_port']} serves one worker process, and --processes {options['processes']} "
                    "would start several on that one port. Run one worker per process manager entry to give each its own port."
                )
            return self._supervise(options["processes"])
        try:
            groups = self._groups(options)
            registry = TaskRegistry.discover(conf.get_setting("TASK_MODULES"))
            _sync_schedules(registry)
            operations.apply_queue_settings(conf.get_setting("QUEUES"))
            worker = Worker(
                groups,
                store_factory=_store_factory,
                registry=registry,
                max_traceback_chars=conf.get_setting("MAX_TRACEBACK_CHARS"),
                log_every=options["log_every"],
                hints=None if options["no_hints"] else _hint_listener(),
                health_port=options["health_port"],
                health_host=options["health_host"],
            )
        except (WorkerGroupConfigError, ValueError) as error:
            raise CommandError(str(error)) from error
        except OSError as error:  # the health port is taken or the address is not ours
            raise CommandError(f"cannot serve the health endpoint on {options['health_host']}:{options['health_port']}: {error}") from error
        code = worker.run(until_idle=options["until_idle"])
        if worker.stragglers:
            # Jobs given back at the drain deadline are still running on handler threads, and
            # the interpreter would wait for them at exit. Their rows are already released.
            logging.shutdown()
            os._exit(code)
        if code:
            raise CommandError("every pump halted; see the log above for the reasons", returncode=code)

    def _supervise(self, processes: int) -> None:
        if processes < 1:
            raise CommandError(f"--processes must be at least 1, got {processes}")
        argv = list(sys.argv)
        # The children run the same command without --processes (one worker each).
        for flag in ("--processes",):
            while flag in argv:
                position = argv.index(flag)
                del argv[position : position + 2]
            argv = [a for a in argv if not a.startswith(flag + "=")]
        code = Supervisor([sys.executable, *argv], processes).run()
        if code:
            raise CommandError("a worker process exited with an error", returncode=code)

    def _groups(self, options):
        overrides = {
            "pool_size": options["pool_size"],
            "pumps": options["pumps"],
            "max_claim_batch": options["max_claim_batch"],
            "poll_interval": options["poll_interval"],
            "lease_duration": options["lease_duration"],
            "maintenance_interval": options["maintenance_interval"],
            "drain_timeout": options["drain_timeout"],
        }
        overrides = {key: value for key, value in overrides.items() if value is not None}
        if options["queues"]:
            queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
            raw_groups = [{"name": options["group"] or "cli", "queues": queues}]
        else:
            raw_groups = list(conf.get_setting("WORKER_GROUPS")) or [{"name": "default", "queues": ["default"]}]
            if options["group"]:
                raw_groups = [g for g in raw_groups if g.get("name") == options["group"]]
                if not raw_groups:
                    raise CommandError(f"No worker group named {options['group']!r} in BACKWAVE['WORKER_GROUPS']")
        retention = Retention(**conf.retention())
        return [replace(group_from_mapping({**raw, **overrides}), retention=retention) for raw in raw_groups]


def _sync_schedules(registry) -> None:
    """Write BACKWAVE["SCHEDULES"] to the Schedule table (ScheduleConfigError, a ValueError, when
    one cannot run). With the database unreachable the worker starts anyway on the rows of the
    last sync: its pumps wait for the database like after any other fault. One it can never
    connect to (no such database or role, bad credentials) starts it too: its pumps halt on that
    refusal, with it as their reason, and the health endpoint answers 503."""
    from backwave.shell.schedules import sync_schedules
    from backwave.store.contract import StoreError, TransientStoreError

    schedules = conf.get_setting("SCHEDULES")
    try:
        store = _store_factory()
    except TransientStoreError as error:
        logger.warning("Schedules not synced, the database is unreachable: %s", error)
        return
    except StoreError as error:
        logger.error("Schedules not synced: %s", error)
        return
    try:
        sync_schedules(store, schedules, registry)
    except TransientStoreError as error:
        logger.warning("Schedules not synced, the database is unreachable: %s", error)
    finally:
        store.close()


def _hint_listener():
    from backwave.shell.hints import HintListener
    from backwave.store.postgres import django_conninfo

    return HintListener(django_conninfo(settings.DATABASES["default"]))


def _store_factory():
    from backwave.store.postgres import PostgresStore

    return PostgresStore.from_django()

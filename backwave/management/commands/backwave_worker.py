"""manage.py backwave_worker: run BackWave's worker groups in this process.

Every group serves the databases its queues live in (``backwave/databases.py``), or the one its
``database`` option or ``--database`` names. Start-up writes each served database's own
schedules and queue settings, and opens one store per pump and one hint listener per database.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from backwave import conf
from backwave.checks import TAG as BACKWAVE_CHECKS
from backwave.core.options import Retention, WorkerGroupConfigError, WorkerGroupOptions, store_timeouts, validate_groups
from backwave.databases import database_problem, place_groups, write_queue_settings
from backwave.observers import ObserverRegistry
from backwave.tasking.registry import TaskRegistry
from backwave.shell.health import inherited_listener, listening_socket
from backwave.shell.supervisor import REPLACE_ME, SUPERVISED_ENV, Supervisor
from backwave.shell.worker import Worker

if TYPE_CHECKING:
    from backwave.store.postgres import PostgresStore

logger = logging.getLogger("backwave.worker")


class Command(BaseCommand):
    help = "Run BackWave worker groups: claim jobs, run them, report outcomes. SIGTERM or SIGINT drains; a second signal stops at once."
    # BackWave's own checks and the models', not every check of the project: the template and
    # URL checks import every template tag library and URLconf (0.4 s of a 0.5 s start-up to
    # the first claim, measured), and a worker renders no template and serves no URL.
    requires_system_checks = [BACKWAVE_CHECKS, checks.Tags.models]

    def add_arguments(self, parser):
        parser.add_argument("--queues", help="Comma-separated queues for a one-off group (instead of BACKWAVE['WORKER_GROUPS']).")
        parser.add_argument(
            "--database",
            default=None,
            help="Serve only this DATABASES alias, for every group (default: the databases of the backends that declare each group's queues).",
        )
        parser.add_argument(
            "--group", default=None, help="Run only this configured group, or name the one-off group (default 'cli')."
        )
        parser.add_argument("--pool-size", type=int, help="Worker threads per pump.")
        parser.add_argument("--pumps", type=int, help="Pumps (claim loops) per group.")
        parser.add_argument("--max-claim-batch", type=int)
        parser.add_argument(
            "--claim-ahead",
            type=int,
            help="Claimed jobs a pump may hold beyond its pool, waiting for a thread while its work is short "
            "(default: 3 x --max-claim-batch less --pool-size, one claim batch at least; 0: claim for free threads only).",
        )
        parser.add_argument(
            "--outcome-linger",
            type=float,
            help="Seconds a finished job's outcome may wait for others before it is written (default 0.01; 0: at once).",
        )
        parser.add_argument("--poll-interval", type=float, help="Seconds between polls when idle.")
        parser.add_argument("--lease-duration", type=float, help="Seconds a lease lives without renewal.")
        parser.add_argument("--maintenance-interval", type=float)
        parser.add_argument("--drain-timeout", type=float, help="Seconds running jobs get to finish after SIGTERM.")
        parser.add_argument(
            "--cancel-grace",
            type=float,
            help="Seconds a cancelled running job's handler gets to stop before its attempt ends cancelled without it.",
        )
        parser.add_argument(
            "--hard-time-limits",
            type=float,
            default=None,
            metavar="SECONDS",
            help="A worker process whose handler still runs SECONDS after it was told to stop (time limit, cancel) drains and "
            "is replaced by a fresh one (a Python thread cannot be killed); runs the worker under a supervisor, as --processes does.",
        )
        parser.add_argument(
            "--until-idle", action="store_true", help="Drain and exit once no due job is left (for scripts and tests)."
        )
        parser.add_argument(
            "--processes", type=int, default=1, help="Run this many worker processes under a supervisor (CPU-bound tasks)."
        )
        parser.add_argument("--no-hints", action="store_true", help="Do not LISTEN for wake-up hints: poll only.")
        parser.add_argument("--log-every", type=float, default=10.0, help="Seconds between throughput lines.")
        parser.add_argument(
            "--health-port",
            type=int,
            default=None,
            help="Serve the health endpoint on this port (200 healthy or degraded, 503 when a group is halted; 0 picks a free port).",
        )
        parser.add_argument(
            "--health-host", default="127.0.0.1", help="Address the health endpoint binds to (default 127.0.0.1)."
        )

    def handle(self, *args, **options):
        _log_somewhere()
        if options["verbosity"] >= 2:
            logging.getLogger("backwave").setLevel(logging.DEBUG)
        # --hard-time-limits supervises even one process: a supervisor must replace it.
        if options["processes"] != 1 or (options["hard_time_limits"] is not None and not os.environ.get(SUPERVISED_ENV)):
            if options["health_port"] and options["processes"] != 1:
                raise CommandError(
                    f"--health-port {options['health_port']} serves one worker process, and --processes {options['processes']} "
                    f"would start {options['processes']} on that one port. Run one worker per process manager entry to give each its own port."
                )
            if options["hard_time_limits"] is not None and not options["hard_time_limits"] > 0:
                raise CommandError(f"--hard-time-limits must be a number of seconds above 0, got {options['hard_time_limits']!r}")
            return self._supervise(options["processes"], self._supervised_listener(options))
        try:
            registry = TaskRegistry.discover(conf.get_setting("TASK_MODULES"))
            groups = self._groups(options, registry)
            conf.get_setting("HINT_DATABASES")  # read before anything starts: a bad alias stops it here
            store_factory = store_factory_for(groups)
            databases = list(dict.fromkeys(group.database for group in groups))
            for database in databases:
                _sync_schedules(registry, database, store_factory)
            for database in databases:
                write_queue_settings(
                    database, [queue for group in groups if group.database == database for queue in group.policy.queues]
                )
            worker = Worker(
                groups,
                store_factory=store_factory,
                registry=registry,
                max_traceback_chars=conf.get_setting("MAX_TRACEBACK_CHARS"),
                max_result_bytes=conf.get_setting("MAX_RESULT_BYTES"),
                log_every=options["log_every"],
                hints=None if options["no_hints"] else {database: _hint_listener(database) for database in databases},
                cleaners=_job_table_cleaners(databases),
                health_port=options["health_port"],
                health_host=options["health_host"],
                # Under a supervisor that bound the port (--hard-time-limits): serve on its socket.
                health_listener=inherited_listener() if os.environ.get(SUPERVISED_ENV) else None,
                hard_time_limit=options["hard_time_limits"],
                observers=ObserverRegistry.discover(conf.get_setting("TASK_MODULES")),
                delivery_options=conf.delivery_options(),
            )
        except (WorkerGroupConfigError, ValueError, ImproperlyConfigured) as error:
            raise CommandError(str(error)) from error
        except OSError as error:  # the health port is taken or the address is not ours
            raise CommandError(
                f"cannot serve the health endpoint on {options['health_host']}:{options['health_port']}: {error}"
            ) from error
        code = worker.run(until_idle=options["until_idle"])
        if worker.replacing:
            # The handler past its hard limit is still running: leave without waiting for it.
            logging.shutdown()
            os._exit(REPLACE_ME)
        if worker.stragglers:
            # Jobs given back at the drain deadline are still running on handler threads, and
            # the interpreter would wait for them at exit. Their rows are already released.
            logging.shutdown()
            os._exit(code)
        if code:
            raise CommandError("every pump halted; see the log above for the reasons", returncode=code)

    @staticmethod
    def _supervised_listener(options):
        """The health endpoint's socket, bound here when one supervised process serves it: its
        replacements serve on the same socket, so the port never changes (and a port in use
        stops the command before any process starts)."""
        if options["health_port"] is None or options["processes"] != 1:
            return None
        try:
            listener = listening_socket(options["health_host"], options["health_port"])
        except OSError as error:
            raise CommandError(
                f"cannot serve the health endpoint on {options['health_host']}:{options['health_port']}: {error}"
            ) from error
        logger.info("Supervisor holds the health endpoint's port %s:%d for its worker process", *listener.getsockname()[:2])
        return listener

    def _supervise(self, processes: int, listener=None) -> None:
        if processes < 1:
            raise CommandError(f"--processes must be at least 1, got {processes}")
        argv = list(sys.argv)
        # The children run the same command without --processes (one worker each).
        for flag in ("--processes",):
            while flag in argv:
                position = argv.index(flag)
                del argv[position : position + 2]
            argv = [a for a in argv if not a.startswith(flag + "=")]
        code = Supervisor([sys.executable, *argv], processes, listener=listener).run()
        if code:
            raise CommandError("a worker process exited with an error", returncode=code)

    def _groups(self, options, registry: TaskRegistry):
        overrides = {
            "pool_size": options["pool_size"],
            "pumps": options["pumps"],
            "max_claim_batch": options["max_claim_batch"],
            "claim_ahead": options["claim_ahead"],
            "outcome_linger": options["outcome_linger"],
            "poll_interval": options["poll_interval"],
            "lease_duration": options["lease_duration"],
            "maintenance_interval": options["maintenance_interval"],
            "drain_timeout": options["drain_timeout"],
            "cancel_grace": options["cancel_grace"],
        }
        overrides = {key: value for key, value in overrides.items() if value is not None}
        if options["queues"]:
            queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
            raw_groups = [{"name": options["group"] or "cli", "queues": queues}]
        else:
            raw_groups = conf.raw_worker_groups(_backwave_task_queues(registry))
            if options["group"]:
                raw_groups = [g for g in raw_groups if g.get("name") == options["group"]]
                if not raw_groups:
                    raise CommandError(f"No worker group named {options['group']!r} in BACKWAVE['WORKER_GROUPS']")
        database = options["database"]
        if database is not None and (problem := database_problem(database)):
            raise CommandError(f"--database {database!r} {problem}")
        retention = Retention(**conf.retention())
        groups = validate_groups(
            replace(conf.group_from_mapping({**raw, **overrides}), retention=retention) for raw in raw_groups
        )
        return place_groups(groups, database=database)


def _log_somewhere() -> None:
    """Without any logging configuration for it (no LOGGING, as startproject leaves a project),
    the backwave logger's records would reach no handler, and Python prints only warnings then:
    the worker would say nothing of its start, its throughput or its stop. Give it one on stderr
    at INFO, and say so once; a project whose LOGGING reaches the logger (a handler on it or on
    an ancestor, root included) keeps its own."""
    backwave_logger = logging.getLogger("backwave")
    if backwave_logger.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    backwave_logger.addHandler(handler)
    if backwave_logger.getEffectiveLevel() > logging.INFO:
        backwave_logger.setLevel(logging.INFO)
    logger.warning(
        "No logging configured for the 'backwave' logger (settings.LOGGING): the worker logs to stderr at INFO. "
        "Add a handler for it to LOGGING to send its lines elsewhere."
    )


def _backwave_task_queues(registry: TaskRegistry) -> set[str]:
    """The queues of the registered tasks that a BackWave backend enqueues (a backend whose empty
    QUEUES accepts any queue declares none of them)."""
    from backwave.databases import backwave_backends

    aliases = {backend.alias for backend in backwave_backends()}
    return {task.queue_name for task in registry.values() if task.backend in aliases}


def _sync_schedules(registry, database: str, store_factory: Callable[[str], PostgresStore]) -> None:
    """Write the schedules of BACKWAVE["SCHEDULES"] whose backend enqueues into ``database`` to
    its Schedule table (ScheduleConfigError, a ValueError, when any one cannot run). With the
    database unreachable the worker starts anyway on the rows of the last sync: its pumps wait
    for the database like after any other fault. One it can never connect to (no such database
    or role, bad credentials) starts it too: its pumps halt on that refusal, with it as their
    reason, and the health endpoint answers 503."""
    from backwave.shell.schedules import sync_schedules
    from backwave.store.contract import StoreError, TransientStoreError

    schedules = conf.get_setting("SCHEDULES")
    try:
        store = store_factory(database)
    except TransientStoreError as error:
        logger.warning("Schedules not synced, database %r is unreachable: %s", database, error)
        return
    except StoreError as error:
        logger.error("Schedules not synced on database %r: %s", database, error)
        return
    try:
        sync_schedules(store, schedules, registry, database=database)
    except TransientStoreError as error:
        logger.warning("Schedules not synced, database %r is unreachable: %s", database, error)
    finally:
        store.close()


def _hint_listener(database: str):
    from backwave.shell.hints import HintListener
    from backwave.store.postgres import django_conninfo

    # Behind a transaction-pooling PgBouncer the LISTEN session goes straight to PostgreSQL.
    listen_on = conf.get_setting("HINT_DATABASES").get(database, database)
    return HintListener(django_conninfo(settings.DATABASES[listen_on]))


def _job_table_cleaners(databases):
    from backwave.shell.vacuum import JobTableCleaner
    from backwave.store.postgres import django_conninfo
    from backwave.store.vacuum import JobTableVacuum

    after = conf.get_setting("VACUUM_JOB_TABLE_AFTER")
    if after is None:
        return {}
    # VACUUM is one statement in autocommit, which a transaction-pooling PgBouncer passes on: the
    # cleanup goes the way the pumps go.
    return {
        database: JobTableCleaner(JobTableVacuum(django_conninfo(settings.DATABASES[database])), after=after, name=database)
        for database in databases
    }


def store_factory_for(groups: Sequence[WorkerGroupOptions]) -> Callable[[str], PostgresStore]:
    """``factory(alias)``: stores on a database for a worker running ``groups``, every statement
    under the timeouts of BACKWAVE["WORKER_STATEMENT_TIMEOUT"] / ["WORKER_LOCK_TIMEOUT"], or those
    derived from the shortest lease of all the groups. Checked here, at start, so a value the
    leases cannot live with stops the worker before any pump runs (WorkerGroupConfigError)."""
    from backwave.store.postgres import PostgresStore

    timeouts = store_timeouts(
        groups,
        statement_timeout=conf.get_setting("WORKER_STATEMENT_TIMEOUT"),
        lock_timeout=conf.get_setting("WORKER_LOCK_TIMEOUT"),
    )
    return partial(
        PostgresStore.from_django,
        statement_timeout=timeouts.statement,
        lock_timeout=timeouts.lock,
        admitted_queues=conf.admitted_queue_names(),
    )

"""Which database each queue's jobs live in, and so which databases a worker serves.

A BackWave backend enqueues into the database of its ``OPTIONS["DATABASE"]`` (``backend.py``), so
a queue lives in the databases of the backends that declare it in their ``QUEUES``; a backend
whose ``QUEUES`` is empty accepts every queue, so every queue lives in its database too. A queue
no backend declares lives in ``default``, where workers have always looked for it.

Before its pumps start, each worker group is placed on databases (``place_groups``):

* A group with a ``database`` (or every group, under ``backwave_worker --database ALIAS``) runs its
  pumps on that database alone, claiming all of its queues there.
* Otherwise the group runs its ``pumps`` on each database its queues live in, and each database's
  pumps claim only the queues that live there: the group's policy restricted to them, in its
  order and with its weights. A claim is one statement on one database, so no claim can order
  jobs across two databases anyway; restricting the policy keeps every claim on queues that can
  have rows where it runs, and keeps Weighted's shares between the queues that compete for the
  same pumps. The placements keep the group's name: it is still one group (one health verdict,
  one ``--group``), whose pumps happen to hold connections to two databases.

Schedules, ``BACKWAVE["QUEUES"]``, leases, maintenance and health rows follow the same map: each
database gets the rows of its own backends and queues (``backwave/management/commands/
backwave_worker.py``, ``backwave/testing/pump.py``).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, OperationalError, connections, router

from . import conf
from .core.options import WorkerGroupConfigError, WorkerGroupOptions
from .store import operator

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BackendDatabase:
    """A BackWave backend of TASKS: its alias, its database and its queues (empty: any queue)."""

    alias: str
    database: str
    queues: frozenset[str]

    def declares(self, queue: str) -> bool:
        return not self.queues or queue in self.queues


def backwave_backends() -> list[BackendDatabase]:
    """Every usable BackWave backend in TASKS, in TASKS order. One whose DATABASE is not a
    DATABASES alias is left out: its own check (backwave.E101) reports it."""
    from django.tasks import task_backends

    from .tasking.backend import BackWaveBackend

    found = []
    for alias in getattr(settings, "TASKS", {}):
        try:
            backend = task_backends[alias]
        except Exception:  # an unimportable backend: Django's own checks say so
            continue
        if isinstance(backend, BackWaveBackend) and isinstance(backend.database, str) and backend.database in settings.DATABASES:
            found.append(BackendDatabase(alias, backend.database, frozenset(map(str, backend.queues))))
    return found


def backend_database(alias: str) -> str:
    """The database a BackWave backend enqueues into (``default`` for a backend not in TASKS)."""
    for backend in backwave_backends():
        if backend.alias == alias:
            return backend.database
    return DEFAULT_DB_ALIAS


def queue_databases(queue: str, backends: Iterable[BackendDatabase] | None = None) -> list[str]:
    """The databases ``queue``'s jobs live in: those of the backends that declare it, else default."""
    backends = backwave_backends() if backends is None else backends
    return list(dict.fromkeys(b.database for b in backends if b.declares(queue))) or [DEFAULT_DB_ALIAS]


def queues_in(database: str, queues: Iterable[str], backends: Iterable[BackendDatabase] | None = None) -> list[str]:
    """Those of ``queues`` whose jobs live in ``database``, in their order."""
    backends = backwave_backends() if backends is None else list(backends)
    return [queue for queue in queues if database in queue_databases(queue, backends)]


def console_databases() -> list[str]:
    """The databases the operator's tools (the admin, ``backwave_jobs``, ``backwave_queue``) show:
    those BackWave's backends enqueue into, in TASKS order, the router's database for the Job
    model first when it is one of them (where the admin always looked); the router's alone when
    no backend is BackWave's."""
    from .models import Job

    routed = router.db_for_read(Job)
    used = list(dict.fromkeys(backend.database for backend in backwave_backends()))
    if routed in used:
        used.remove(routed)
        used.insert(0, routed)
    return used or [routed]


def not_a_console_database(alias, databases: list[str] | None = None) -> str:
    """The sentence refusing ``alias`` as one of ``console_databases()``."""
    databases = console_databases() if databases is None else databases
    close = difflib.get_close_matches(str(alias), databases, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{alias!r} is not a database BackWave's backends use ({', '.join(databases)}).{hint}"


def database_problem(alias) -> str | None:
    """Why ``alias`` cannot be a database a worker serves (a sentence's end), or None."""
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        close = difflib.get_close_matches(str(alias), list(settings.DATABASES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"is not in DATABASES ({', '.join(settings.DATABASES)}).{hint}"
    vendor = connections[alias].vendor  # the wrapper only: nothing connects
    if vendor != "postgresql":
        return f"is a {vendor} database, and BackWave needs PostgreSQL."
    return None


def place_groups(groups: Iterable[WorkerGroupOptions], *, database: str | None = None) -> list[WorkerGroupOptions]:
    """One WorkerGroupOptions per (group, database) it serves, ``database`` set on each (see the
    module docstring). ``database`` overrides every group's own (already validated by the caller).
    Raises WorkerGroupConfigError for a group's database that cannot be served."""
    backends = backwave_backends()
    placed = []
    for group in groups:
        pinned = database or group.database
        if pinned is not None:
            if database is None and (problem := database_problem(pinned)):
                raise WorkerGroupConfigError(f"Worker Group '{group.name}': database {pinned!r} {problem}")
            placed.append(replace(group, database=pinned))
            continue
        by_database: dict[str, list[str]] = {}
        for queue in group.policy.queues:
            for alias in queue_databases(queue, backends):
                by_database.setdefault(alias, []).append(queue)
        if len(by_database) == 1:
            (alias,) = by_database
            placed.append(replace(group, database=alias))
            continue
        for alias, queues in by_database.items():
            try:
                policy = group.policy.only(queues)
            except NotImplementedError as error:
                raise WorkerGroupConfigError(
                    f"Worker Group '{group.name}': its queues live in databases {', '.join(by_database)}, and its policy "
                    f"{group.policy!r} cannot be split between them ({error}). Give the group a 'database', or make one group per database."
                ) from error
            placed.append(replace(group, database=alias, policy=policy))
    return placed


def unserved_backends(placed: Iterable[WorkerGroupOptions]) -> list[BackendDatabase]:
    """The BackWave backends whose database none of the ``placed`` groups serves."""
    served = {group.database for group in placed}
    return [backend for backend in backwave_backends() if backend.database not in served]


def apply_queue_settings(settings_queues, *, database: str | None = None) -> int:
    """Write BACKWAVE["QUEUES"] (validated by conf) into the queues' rows of ``database`` (None:
    the Queue model's database). Only the keys a queue's entry names are written; the rest keep
    what the admin set."""
    upserts = operator.queue_settings_upserts(settings_queues)
    if not upserts:
        return 0  # no connection for nothing to write: a database the pumps cannot use is theirs to report
    if database is None:
        from .models import Queue

        database = router.db_for_write(Queue)
    with connections[database].cursor() as cursor:
        return sum(operator.upsert_queues(cursor, [name], **values) for name, values in upserts)


def write_queue_settings(database: str, claimed: Iterable[str] = ()) -> int:
    """A worker's start-up, once per database it serves: BACKWAVE["QUEUES"] for the queues that
    live in ``database`` or that its pumps claim there (``claimed``), into that database's rows.
    The admission limits (key_concurrency_limit, rate_limit) are the settings' alone: each queue
    claimed gets them as the settings say, cleared when they say nothing (a plain claim leaves
    a queue whose row carries one alone, so a stale one would stop the queue)."""
    settings_queues = conf.get_setting("QUEUES")
    claimed = set(claimed)
    here = set(queues_in(database, settings_queues)) | claimed
    try:
        written = apply_queue_settings({name: spec for name, spec in settings_queues.items() if name in here}, database=database)
    except OperationalError as error:
        if connections[database].connection is not None:
            raise
        # No connection at all (a missing database, an unknown role): the pumps cannot use it
        # either, and halt saying why; refusing to start here would hide that behind a crash.
        logger.error("Queue settings not written on database %r: %s", database, error)
        return 0
    admitted = conf.admitted_queue_names(settings_queues)
    if claimed & admitted:
        # Limits on queues this worker claims: a database that refuses them stops the worker
        # here, as the other queue settings do, rather than let its pumps claim them unlimited.
        _write_admission(database, here & claimed & admitted, admitted, settings_queues)
    # The rest, best effort: other queues' limits (their own workers write them too), and stale
    # limits to clear. A database the pumps cannot use is theirs to report (they halt with the
    # reason), and a limited row left as it is stops no one from seeing it (a plain claim gives
    # it no room).
    try:
        _write_admission(database, (here & admitted) - claimed | (here & claimed) - admitted, admitted, settings_queues)
    except DatabaseError as error:
        logger.warning("Queue limits not written on database %r: %s", database, error)
    return written


def _write_admission(database: str, names: set[str], admitted: frozenset[str], settings_queues) -> None:
    with connections[database].cursor() as cursor:
        for name in sorted(names):
            if name in admitted or _has_admission_row(cursor, name):
                operator.set_queue_admission(cursor, name, **conf.admission_limits(settings_queues.get(name, {})))


def _has_admission_row(cursor, name: str) -> bool:
    """Whether the queue's row carries an admission limit (start-up only: one read per queue)."""
    return operator.queue_has_admission(cursor, name)

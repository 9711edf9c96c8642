"""System checks on the database connections the configured worker groups will need.

backwave.W010  a worker process needs more connections than the configured psycopg pool holds
backwave.W011  a worker process needs more connections than the server accepts (database check:
               ``manage.py check --database default``)

Per pump: one connection for the store (claims, outcomes, heartbeats), plus one per worker thread
whose handler touches the database (Django keeps one per thread); per process: one LISTEN
connection for wake-up hints. That is the seeds' "2 to 3 per pump" for pumps with small pools,
and more when handlers use the ORM: the count below assumes every handler does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import conf
from .checks import TAG
from .core.options import WorkerGroupOptions
from .store import operator


def connections_per_process(groups: Iterable[Mapping | WorkerGroupOptions]) -> tuple[int, int]:
    """(store and listener connections, handler connections) one worker process may open;
    a group given as its settings dict has the defaults of WorkerGroupOptions."""
    engine = 1  # the LISTEN connection
    handlers = 0
    for group in groups:
        options = group if isinstance(group, WorkerGroupOptions) else conf.group_from_mapping(group)
        engine += options.pumps
        handlers += options.pumps * options.pool_size
    return engine, handlers


def _groups() -> list[WorkerGroupOptions]:
    try:
        return conf.worker_groups()
    except (ImproperlyConfigured, ValueError):  # WorkerGroupConfigError is a ValueError
        return []  # backwave.E003 or E006 says what is wrong with the groups


@checks.register(TAG)
def check_connection_pool(app_configs=None, **kwargs):
    """Warn when Django's connection pool is smaller than the worker threads that may use it."""
    pool = (settings.DATABASES.get("default", {}).get("OPTIONS") or {}).get("pool")
    if not pool:
        return []
    max_size = pool.get("max_size") if isinstance(pool, dict) else None
    if not isinstance(max_size, int):
        return []
    _, handlers = connections_per_process(_groups())
    if handlers <= max_size:
        return []
    return [
        checks.Warning(
            f"The worker groups run up to {handlers} handler threads per process, but the 'default' database's "
            f"connection pool holds at most {max_size} connections: handlers that use the ORM would wait for one.",
            hint="Raise OPTIONS['pool']['max_size'], or lower pool_size / pumps in BACKWAVE['WORKER_GROUPS'].",
            id="backwave.W010",
        )
    ]


@checks.register(checks.Tags.database)
def check_server_connections(app_configs=None, databases=None, **kwargs):
    """Warn when one worker process could need more connections than the server accepts."""
    if not databases or "default" not in databases:
        return []
    if connections["default"].vendor != "postgresql":
        return []  # backwave.E102 says so; the count below is PostgreSQL's own SQL
    with connections["default"].cursor() as cursor:
        available = operator.available_connections(cursor)
    engine, handlers = connections_per_process(_groups())
    needed = engine + handlers
    if needed <= available:
        return []
    return [
        checks.Warning(
            f"One worker process may open {needed} connections ({engine} for pumps and wake-up hints, {handlers} "
            f"for handler threads) but the server accepts {available}; every further process or web worker needs its own.",
            hint="Raise max_connections, put handlers behind a pool, or lower pool_size / pumps.",
            id="backwave.W011",
        )
    ]

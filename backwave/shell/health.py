"""Health: how pump statuses add up, and the worker's HTTP health endpoint.

A pump is healthy, degraded (a transient store fault: it retries on its own) or halted (fail-stop:
it stopped, its lease lapses and other pumps take its jobs). A group is halted only when every
one of its pumps is; one halted pump among live siblings makes it degraded. The same rule serves
the endpoint (the pumps of one process) and ``manage.py backwave_health`` (every pump's row).

A process is halted when one of its groups is, and unhealthy when a part of it has stopped
working without halting: a wake-up hint listener's thread died, or a pump has had no store call
complete for longer than its lease (stalled, whatever the reason). It is degraded when anything
is (a degraded pump, a listener reconnecting: polling covers for it).

The endpoint (``backwave_worker --health-port N``) answers a GET of ``/metrics`` with the worker's
Prometheus metrics (``backwave/shell/metrics.py``) and any other GET with a JSON body: 200 while
the process is healthy or degraded, 503 once it is halted or unhealthy, which is what a load
balancer's or an orchestrator's probe needs. It runs the standard library's HTTP server on a
daemon thread and reads only in-memory state, so it answers even while the database is
unreachable.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from backwave.core.health import DEGRADED, HALTED, HEALTHY

logger = logging.getLogger("backwave.health")

UNHEALTHY = "unhealthy"  # a process-level verdict only: a pump's own status is one of core.health's three
FAILING = frozenset({HALTED, UNHEALTHY})  # the endpoint answers 503


def group_status(statuses: Iterable[str]) -> str:
    """Halted when every pump is; degraded when any is not healthy; healthy otherwise."""
    statuses = list(statuses)
    if statuses and all(status == HALTED for status in statuses):
        return HALTED
    if any(status != HEALTHY for status in statuses):
        return DEGRADED
    return HEALTHY


def overall_status(group_statuses: Iterable[str]) -> str:
    """Halted when any group is (its work is not being done here); else the worst of the rest."""
    statuses = list(group_statuses)
    if HALTED in statuses:
        return HALTED
    return DEGRADED if DEGRADED in statuses else HEALTHY


def process_status(group_statuses: Iterable[str], *, unhealthy: bool = False, degraded: bool = False) -> str:
    """The process's verdict: its groups' (``overall_status``), made unhealthy by a part of the
    process that stopped working, or degraded by one that limps."""
    status = overall_status(group_statuses)
    if status == HALTED:
        return HALTED
    if unhealthy:
        return UNHEALTHY
    return DEGRADED if degraded else status


# A scrape's (body, content type) for the Accept header it sent.
Metrics = Callable[[str | None], tuple[bytes, str]]


class HealthServer:
    """Serves ``snapshot()`` as JSON on ``host:port`` (port 0: any free port, see ``.port``), and
    ``metrics`` (when given) on ``/metrics``."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], *, host: str = "127.0.0.1", port: int = 0, metrics: Metrics | None = None):
        handler = _handler_for(snapshot, metrics)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="backwave-health", daemon=True)

    def start(self) -> None:
        self._thread.start()
        logger.info("Health endpoint on http://%s:%d/", self.host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(snapshot: Callable[[], dict[str, Any]], metrics: Metrics | None) -> type[BaseHTTPRequestHandler]:
    class HealthHandler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            if metrics is not None and urlsplit(self.path).path.rstrip("/") == "/metrics":
                return self._metrics()
            try:
                body = snapshot()
                code = 503 if body["status"] in FAILING else 200
            except Exception as error:  # a bug here must not look like a healthy worker
                logger.exception("The health snapshot failed")
                body, code = {"status": "unknown", "error": str(error)}, 500
            self._send(code, json.dumps(body, indent=2).encode(), "application/json")

        def _metrics(self):
            try:
                data, content_type = metrics(self.headers.get("Accept"))
            except Exception:  # a scrape that fails says so; the worker goes on
                logger.exception("The metrics scrape failed")
                self._send(500, b"the metrics could not be collected; see the worker's log\n", "text/plain; charset=utf-8")
                return
            self._send(200, data, content_type)

        def _send(self, code: int, data: bytes, content_type: str):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # noqa: A002 - http.server's signature
            logger.debug("health endpoint: " + format, *args)

    return HealthHandler

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

Clients cannot pin its threads: each connection is served on a thread of its own, at most
``MAX_CONNECTIONS`` at once, and has ``REQUEST_TIMEOUT`` seconds for its whole request and
answer (a client that connects and sends nothing, or trickles its request a byte at a time, is
cut off then). When every thread is taken, a new connection takes the place of the oldest one
still waiting for its request, so a flood of idle connections cannot keep a probe out; when
every one is busy answering, the new connection is closed unanswered.

The listening socket may be made by another process and inherited (``inherited_listener``):
under ``--hard-time-limits`` the supervisor binds the port once and each worker process it
starts, the first and every replacement, serves on that socket, so the port never changes and
a probe made while one process hands over to the next waits in the socket's backlog instead of
being refused.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
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


# Seconds a connection has for its whole request and answer: a probe or a scrape takes
# milliseconds, and a client that sends nothing must not hold a thread for longer.
REQUEST_TIMEOUT = 10.0
# Connections served at once, each on a thread: a probe and a scraper or two need far fewer.
MAX_CONNECTIONS = 16
# Set by the supervisor in a worker process's environment: the file descriptor of the listening
# socket it bound for the process to serve on.
LISTENER_FD_ENV = "BACKWAVE_HEALTH_FD"


def listening_socket(host: str, port: int) -> socket.socket:
    """The endpoint's bound and listening socket (port 0: a free one); OSError when the port is
    taken or the address is not this host's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=64)


def inherited_listener() -> socket.socket | None:
    """The listening socket a supervisor passed this process (see ``LISTENER_FD_ENV``), or None."""
    fd = os.environ.get(LISTENER_FD_ENV)
    return None if not fd else socket.socket(fileno=int(fd))


class HealthServer:
    """Serves ``snapshot()`` as JSON on ``host:port`` (port 0: any free port, see ``.port``), or
    on ``listener``, a listening socket made elsewhere; and ``metrics`` (when given) on ``/metrics``."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        metrics: Metrics | None = None,
        listener: socket.socket | None = None,
    ):
        listener = listener if listener is not None else listening_socket(host, port)
        self._server = _BoundedServer(
            listener, _handler_for(snapshot, metrics), timeout=REQUEST_TIMEOUT, max_connections=MAX_CONNECTIONS
        )
        self.host, self.port = listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="backwave-health", daemon=True)

    def start(self) -> None:
        self._thread.start()
        logger.info("Health endpoint on http://%s:%d/ (pid %d)", self.host, self.port, os.getpid())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer on a socket it is given, with at most ``max_connections`` handler
    threads and one deadline per connection (see the module's docstring)."""

    daemon_threads = True
    block_on_close = False  # nothing to join at close: the threads are daemons with deadlines

    def __init__(self, listener: socket.socket, handler, *, timeout: float, max_connections: int):
        super().__init__(listener.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # the one TCPServer made, unbound: serve on the listener instead
        self.socket = listener
        self.server_name, self.server_port = socket.getfqdn(self.server_address[0]), self.server_address[1]
        self.request_timeout = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        # connection -> (deadline, still waiting for its request). Written by the server thread
        # (a new connection, an eviction) and by each handler thread (its request came, it
        # ended): single dict operations, atomic on CPython, and a copy to iterate.
        self._connections: dict[socket.socket, tuple[float, bool]] = {}

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False) and not self._evict_one():
            logger.warning(
                "Health endpoint: all %d connections are busy answering; one from %s closed unanswered",
                len(self._connections),
                client_address[0],
            )
            self.shutdown_request(request)
            return
        self._connections[request] = (time.monotonic() + self.request_timeout, True)
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._ended(request)
            raise

    def _evict_one(self) -> bool:
        """Cut the oldest connection still waiting for its request, and take its thread's slot
        once that thread has ended (at once: its read fails); False when none is waiting."""
        waiting = [(deadline, connection) for connection, (deadline, idle) in self._connections.copy().items() if idle]
        if not waiting:
            return False
        _, oldest = min(waiting, key=lambda pair: pair[0])
        _cut(oldest)
        return self._slots.acquire(timeout=1.0)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._ended(request)

    def _ended(self, request) -> None:
        if self._connections.pop(request, None) is not None:
            self._slots.release()

    def answering(self, connection) -> None:
        """The connection's request came in whole: it is answered now, never evicted."""
        if (entry := self._connections.get(connection)) is not None:
            self._connections[connection] = (entry[0], False)

    def service_actions(self):
        # Called by serve_forever at least every half second: a connection past its deadline
        # is cut, whatever its thread is doing (a read that never completes, a slow write).
        now = time.monotonic()
        for connection, (deadline, _) in self._connections.copy().items():
            if deadline <= now:
                _cut(connection)

    def handle_error(self, request, client_address):
        # A connection cut at its deadline or by an eviction fails its read or write: no stderr traceback.
        logger.debug("Health endpoint: a connection from %s ended with an error", client_address[0], exc_info=True)


def _cut(connection: socket.socket) -> None:
    """End a connection's reads and writes, so its handler thread returns; a closed one is left."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _handler_for(snapshot: Callable[[], dict[str, Any]], metrics: Metrics | None) -> type[BaseHTTPRequestHandler]:
    class HealthHandler(BaseHTTPRequestHandler):
        # Each read and write on the connection waits at most this long (the connection's whole
        # deadline is the server's, in service_actions).
        timeout = REQUEST_TIMEOUT

        def parse_request(self):
            parsed = super().parse_request()
            if parsed:
                self.server.answering(self.connection)
            return parsed

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

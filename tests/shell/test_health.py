"""Health: group rules, the HTTP endpoint, and ``manage.py backwave_health`` on pump rows."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from backwave.models import Job, Pump
from backwave.shell.health import DEGRADED, HALTED, HEALTHY, HealthServer, group_status, overall_status
from tests.factories import JobFactory, make_lease
from tests.shell.conftest import wait_until


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([HEALTHY, HEALTHY], HEALTHY),
        ([HEALTHY, DEGRADED], DEGRADED),
        ([HEALTHY, HALTED], DEGRADED),  # one halted pump among live siblings: the group works on
        ([HALTED, HALTED], HALTED),
        ([HALTED], HALTED),
        ([], HEALTHY),
    ],
)
def test_a_group_is_halted_only_when_every_pump_is(statuses, expected):
    assert group_status(statuses) == expected


def test_a_process_is_halted_when_any_of_its_groups_is():
    assert overall_status([HEALTHY, HALTED]) == HALTED
    assert overall_status([HEALTHY, DEGRADED]) == DEGRADED
    assert overall_status([]) == HEALTHY


def test_the_endpoint_answers_200_until_halted_then_503():
    state = {"status": HEALTHY, "pumps": []}
    server = HealthServer(lambda: dict(state), port=0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/"
        assert get(url) == (200, {"status": "healthy", "pumps": []})
        state["status"] = DEGRADED
        assert get(url)[0] == 200
        state["status"] = HALTED
        assert get(url + "anything") == (503, {"status": "halted", "pumps": []})
    finally:
        server.close()


def _closed_by_the_server(connection) -> bool:
    """Whether the server has closed this idle client connection (EOF or a reset)."""
    try:
        return connection.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_connections_neither_pin_threads_nor_keep_the_endpoint_from_answering(monkeypatch):
    """300 clients that connect and send nothing: the endpoint holds at most MAX_CONNECTIONS
    threads for them, answers a probe meanwhile, and closes each idle one (the oldest first when
    all its threads are taken, the rest at their deadline)."""
    import socket
    import threading

    from backwave.shell import health

    monkeypatch.setattr(health, "REQUEST_TIMEOUT", 1.0, raising=False)  # the deadline, shortened for the test
    before = threading.active_count()
    server = HealthServer(lambda: {"status": HEALTHY}, port=0)
    server.start()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        # Accepted in order: once this probe is answered, all 300 before it were handed a thread or closed.
        assert get(f"http://127.0.0.1:{server.port}/") == (200, {"status": "healthy"})
        threads = threading.active_count() - before
        assert threads <= 1 + getattr(health, "MAX_CONNECTIONS", 16), f"{threads} threads for 300 idle connections"
        for connection in idle:
            connection.setblocking(False)
        wait_until(lambda: all(_closed_by_the_server(c) for c in idle), "every idle connection closed by the server", timeout=30)
        assert get(f"http://127.0.0.1:{server.port}/")[0] == 200
    finally:
        for connection in idle:
            connection.close()
        server.close()


def test_a_client_that_trickles_its_request_is_cut_at_the_deadline(monkeypatch):
    """A byte at a time, each within the socket timeout: the whole request still has one deadline."""
    import socket

    from backwave.shell import health

    monkeypatch.setattr(health, "REQUEST_TIMEOUT", 1.0, raising=False)
    server = HealthServer(lambda: {"status": HEALTHY}, port=0)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
            slow.setblocking(False)
            sent = 0
            import time

            while not _closed_by_the_server(slow) and sent < 100:
                slow.send(b"G")  # a request line that never ends, 0.1 s a byte
                sent += 1
                time.sleep(0.1)
        assert sent < 100, "the trickling client was never cut off"
    finally:
        server.close()


def test_a_broken_snapshot_is_a_500_not_a_healthy_answer():
    server = HealthServer(lambda: 1 / 0, port=0)
    server.start()
    try:
        code, body = get(f"http://127.0.0.1:{server.port}/")
    finally:
        server.close()
    assert code == 500 and body["status"] == "unknown"


# ---- manage.py backwave_health -------------------------------------------------------------------


def pump(worker_id, group="g", status="healthy", *, seconds_ago=0.0, reason="", lease_duration=30.0, lease_expires_in=30.0):
    """A pump's row and (unless ``lease_expires_in`` is None) its lease, as a running pump holds one."""
    Pump.objects.create(
        worker_id=worker_id, group=group, hostname="h", pid=1, status=status, reason=reason, lease_duration=lease_duration
    )
    if lease_expires_in is not None:
        make_lease(worker_id, lease_expires_in, group=group, hostname="h", pid=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE backwave_pump SET last_heartbeat_at = now() - make_interval(secs => %s) WHERE worker_id = %s",
            [seconds_ago, worker_id],
        )


def run_health(*args) -> tuple[int, str]:
    from io import StringIO

    out = StringIO()
    try:
        call_command("backwave_health", *args, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue() + str(error)
    return 0, out.getvalue()


@pytest.mark.django_db
def test_all_healthy_exits_zero_with_a_table():
    pump("h:1:g:0", seconds_ago=2)
    pump("h:1:g:1", status="degraded", reason="connection refused", seconds_ago=2)
    code, out = run_health()
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["GROUP", "PUMP", "HOST", "PID", "STATUS", "IN", "FLIGHT", "HEARTBEAT", "REASON"]
    assert "degraded" in lines[1] and "connection refused" in lines[1], "not healthy first"
    assert any(line.split()[:2] == ["g", "degraded"] for line in lines)


@pytest.mark.django_db
def test_one_halted_pump_is_shown_first_with_its_reason_but_the_group_is_not_halted():
    pump("h:1:g:0", seconds_ago=1)
    pump("h:1:g:1", status="halted", reason="InvalidEvent: no WriteOutcomes is in flight", seconds_ago=500)
    code, out = run_health()
    assert code == 0, out
    assert "halted" in out.splitlines()[1] and "InvalidEvent: no WriteOutcomes is in flight" in out.splitlines()[1]
    assert "(stale)" not in out, "a halted pump stopped heartbeating on purpose"


@pytest.mark.django_db
def test_a_group_whose_pumps_all_halted_exits_non_zero():
    pump("h:1:ok:0", group="ok")
    pump("h:1:doomed:0", group="doomed", status="halted", reason="boom")
    code, out = run_health()
    assert code == 1
    assert "group 'doomed' is halted (every pump is)" in out
    assert run_health("--group", "ok")[0] == 0


@pytest.mark.django_db
def test_a_stale_heartbeat_exits_non_zero():
    pump("h:1:g:0", seconds_ago=45, lease_duration=30)
    code, out = run_health()
    assert code == 1 and "healthy (stale)" in out and "has not sent a heartbeat for 45" in out
    assert run_health("--stale-after", "60")[0] == 0


@pytest.mark.django_db
def test_a_pump_without_a_live_lease_is_lost_and_exits_non_zero_though_its_row_says_healthy():
    pump("h:1:g:0", seconds_ago=1)
    pump("h:1:g:1", seconds_ago=1, lease_expires_in=None)
    pump("h:1:g:2", seconds_ago=1, lease_expires_in=None)  # its lease already expired and deleted
    lapsed = make_lease("h:1:g:1", -5, group="g").id  # killed: its lease lapsed, not yet expired
    JobFactory.create_batch(4, state="running", lease_id=lapsed, attempts=1, worker_id="h:1:g:1")
    code, out = run_health()
    assert code == 1, out
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[1:4]] == ["h:1:g:1", "h:1:g:2", "h:1:g:0"], "lost first"
    assert lines[1].split()[4:7] == ["lost:", "healthy", "4"], "lost, with its jobs counted live"
    assert "pump h:1:g:1 is lost: it holds no live lease (it last reported healthy)" in out
    assert "pump h:1:g:2 is lost" in out and "h:1:g:0 is lost" not in out


@pytest.mark.django_db
def test_no_pump_at_all_is_not_healthy():
    code, out = run_health()
    assert code == 1 and "No pump has reported its health" in out
    with pytest.raises(CommandError, match="--stale-after must be a positive number"):
        call_command("backwave_health", "--stale-after", "0")


# ---- the worker command's flags ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_health_port_in_use_stops_the_worker_before_it_starts():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve the health endpoint on 127.0.0.1:{port}"):
            call_command("backwave_worker", "--queues", "e2e", "--health-port", str(port), "--no-hints")


def test_a_health_port_in_use_stops_a_supervised_worker_before_any_process_starts(monkeypatch):
    import socket

    monkeypatch.delenv("BACKWAVE_SUPERVISED", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve the health endpoint on 127.0.0.1:{port}"):
            call_command("backwave_worker", "--queues", "e2e", "--hard-time-limits", "1", "--health-port", str(port))


def test_one_health_port_cannot_serve_several_processes():
    with pytest.raises(CommandError, match="--health-port 8081 serves one worker process, and --processes 2 would start 2"):
        call_command("backwave_worker", "--processes", "2", "--health-port", "8081")


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_health_port_of_a_worker_under_hard_time_limits_outlives_its_replacement(start_worker):
    """--hard-time-limits runs one worker process under a supervisor, which replaces it when a
    handler will not stop: the supervisor holds the port, so the endpoint stays on it, served by
    the process that runs now."""
    import re

    from backwave.models import Attempt, Job
    from tests.shell import worker_tasks

    import socket

    with socket.socket() as probe:  # a port free now, named as an operator names one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = worker_tasks.hangs_on_first_attempt.enqueue()
    worker = start_worker(
        "--queues",
        "e2e",
        "--hard-time-limits",
        "0.5",
        "--drain-timeout",
        "2",
        "--health-port",
        str(port),
        "--poll-interval",
        "0.05",
        "--maintenance-interval",
        "0.5",
        "--log-every",
        "0.5",
    )
    worker.wait_for(
        lambda: Job.objects.get(id=result.id).state == "succeeded", timeout=60, what="the retry succeeding in a new process"
    )
    served = re.findall(r"Health endpoint on http://127\.0\.0\.1:(\d+)/ \(pid (\d+)\)", worker.output)
    assert [int(p) for p, _ in served] == [port, port], worker.output  # the first process, then its replacement
    code, body = get(f"http://127.0.0.1:{port}/")
    assert code == 200 and body["status"] == "healthy", body
    replacement = Job.objects.get(id=result.id).return_value
    first_pid = int(Attempt.objects.get(job_id=result.id, number=1).worker_id.split(":")[1])
    assert body["pid"] == replacement != first_pid
    worker.signal()
    assert worker.wait() == 0, worker.output


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_worker_calls_a_due_queue_that_no_live_pump_serves_degraded_and_says_why(start_worker):
    """The quick start's failure seen from a worker: it serves 'e2e', the job waits on 'emails'."""
    import re

    from tests.shell import worker_tasks

    waiting = worker_tasks.noop.using(queue_name="emails").enqueue()
    served = worker_tasks.noop.enqueue()
    # A 3 s lease: the worker reads the unserved queues at each heartbeat (1 s).
    worker = start_worker("--queues", "e2e", "--health-port", "0", "--lease-duration", "3", "--poll-interval", "0.05")
    worker.wait_for(lambda: "Health endpoint on http://" in worker.output, what="the health endpoint to listen")
    url = re.search(r"Health endpoint on (http://\S+)", worker.output).group(1)
    worker.wait_for(lambda: get(url)[1].get("queues"), what="the unserved queue in the health JSON")
    code, body = get(url)
    assert code == 200 and body["status"] == "degraded", body
    assert body["groups"] == {"cli": "healthy"}, "its own pumps are fine"
    (queue,) = body["queues"]
    assert (queue["queue"], queue["database"], queue["status"]) == ("emails", "default", "degraded")
    assert re.fullmatch(r"due for \d+ s; no worker serves `emails`", queue["reason"]), queue
    assert "Queue 'emails' is degraded: due for" in worker.output
    worker.wait_for(lambda: Job.objects.get(id=served.id).state == "succeeded", what="its own queue's job done")
    assert Job.objects.get(id=waiting.id).state == "ready"
    code, out = run_health()
    assert code == 0 and "emails" in out and "no worker serves `emails`" in out, out
    worker.signal()
    assert worker.wait() == 0, worker.output


@pytest.mark.django_db(databases=["default", "other"])
def test_pumps_of_other_databases_are_read_with_database_and_judged_per_database():
    pump("h:1:g:0", group="g")
    Pump.objects.using("other").create(
        worker_id="h:1:g:1", group="g", hostname="h", pid=1, status="halted", reason="boom", lease_duration=30.0
    )
    code, out = run_health()
    assert code == 0 and "h:1:g:1" not in out, "default only, unless told"
    code, out = run_health("--database", "default", "--database", "other")
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["DATABASE", "GROUP"]
    assert lines[1].split()[:3] == ["other", "g", "h:1:g:1"], "halted first"
    # Its pumps on "default" cannot take the jobs of "other" over: halted there is halted.
    assert "group 'g' is halted (every pump is on 'other')" in out
    with pytest.raises(CommandError, match=r"--database 'othr' is not in DATABASES \(default, other\)\. Did you mean 'other'\?"):
        call_command("backwave_health", "--database", "othr")


def test_a_group_whose_pumps_on_one_of_its_databases_all_halted_reads_halted():
    from backwave.core.options import WorkerGroupOptions
    from backwave.core.policy import Strict
    from backwave.tasking.registry import TaskRegistry
    from backwave.shell.worker import Worker

    placed = [
        WorkerGroupOptions(name="g", policy=Strict("local"), pool_size=1, database="default"),
        WorkerGroupOptions(name="g", policy=Strict("remote"), pool_size=1, database="other"),
    ]
    worker = Worker(placed, store_factory=lambda alias: pytest.fail("nothing opens a store here"), registry=TaskRegistry())
    try:
        assert [pump.worker_id.split(":")[3] for pump in worker.pumps] == ["0", "1"], "numbered across the group's databases"
        assert worker.health_snapshot()["groups"] == {"g": HEALTHY}
        worker.pumps[1].health = HALTED
        snapshot = worker.health_snapshot()
        # The pump on "default" cannot take the jobs of "other" over: the group is halted.
        assert (snapshot["status"], snapshot["groups"]) == (HALTED, {"g": HALTED})
        assert [(p["database"], p["status"]) for p in snapshot["pumps"]] == [("default", HEALTHY), ("other", HALTED)]
    finally:
        for pump in worker.pumps:
            pump._pool.shutdown()

"""What every benchmark shares: Django set up on a benchmark database, filling the job table
fast, running a worker (or the bare loop) as a child process and reading its CPU time, and
reading drain rates from the database clock.

Benchmarks empty the job table, so they refuse a database whose name does not contain "bench"
(``bench/run_all.sh`` creates and migrates ``backwave_bench``). Rates come from the database's
timestamps (first claim to last finish), CPU from the kernel's accounting of the child process
(``wait4``: user + system seconds of the worker and of every process it waited for), so other
load on the machine stretches wall time but hardly moves CPU per job.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from backwave.tasking.task import enqueue_many  # noqa: E402

QUEUE = "bench"
PYTHON = sys.executable
# The checkout whose manage.py runs the workers: this one, or another (BENCH_WORKER_ROOT) to
# compare two versions of BackWave with the same benchmark and the same baseline.
WORKER_ROOT = Path(os.environ.get("BENCH_WORKER_ROOT", ROOT))


def compile_bytecode() -> None:
    """Compile the worker's checkout (BackWave and the demo project) and the bare loop to
    bytecode, as ``pip install`` leaves a package: with PYTHONDONTWRITEBYTECODE set (common in
    containers, and on CI machines) every start would otherwise compile some 200 modules from
    source first, a cost of the environment that is the same for any Django worker (the README's
    *Start-up* says to run compileall when building an image). Files already compiled are left
    alone, so this costs nothing after the first benchmark."""
    targets = [WORKER_ROOT / "backwave", WORKER_ROOT / "project", WORKER_ROOT / "manage.py", ROOT / "bench" / "bare.py"]
    subprocess.run([PYTHON, "-m", "compileall", "-q", *map(str, targets)], check=True, stdout=subprocess.DEVNULL)


compile_bytecode()


def database_name() -> str:
    return connection.settings_dict["NAME"]


def database_url() -> str:
    """The benchmark database's URL, for the bare loop (which runs without Django)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        sys.exit("set DATABASE_URL to a benchmark database (bench/run_all.sh creates backwave_bench)")
    return url


def bare_command(mode: str, *options: str) -> list[str]:
    """The bare loop (bench/bare.py) in ``mode`` on the benchmark database, with ``options``."""
    return [PYTHON, str(ROOT / "bench" / "bare.py"), mode, "--url", database_url(), *options]


def require_bench_database() -> None:
    name = database_name()
    if "bench" not in name:
        sys.exit(
            f"the benchmarks empty the job table, and the database {name!r} is not a benchmark database; "
            "set DATABASE_URL to one whose name contains 'bench' (bench/run_all.sh creates backwave_bench)"
        )


def sql(statement: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def reset() -> None:
    """An empty job table (and attempts, leases, pump rows), vacuumed and analyzed."""
    require_bench_database()
    sql("TRUNCATE backwave_attempt, backwave_job, backwave_lease RESTART IDENTITY CASCADE")
    sql("DELETE FROM backwave_pump")
    for table in ("backwave_job", "backwave_attempt", "backwave_lease"):
        sql(f"VACUUM ANALYZE {table}")


def set_autovacuum(enabled: bool) -> None:
    for table in ("backwave_job", "backwave_attempt"):
        sql(f"ALTER TABLE {table} SET (autovacuum_enabled = {'true' if enabled else 'false'})")


_COPIED = None


def _copied_columns() -> list[str]:
    global _COPIED
    if _COPIED is None:
        rows = sql(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'backwave_job' "
            "AND column_name NOT IN ('id', 'state', 'finished_at', 'attempts', 'payload') ORDER BY ordinal_position"
        )
        _COPIED = [row[0] for row in rows]
    return _COPIED


def fill(task, args: list, count: int, *, state: str = "ready") -> None:
    """``count`` jobs of ``task(*args)``: one through enqueue_many (what a user's enqueue writes),
    the rest copied from it by one INSERT ... SELECT (a million in seconds, not minutes).
    ``state`` 'succeeded' makes finished rows instead."""
    (result,) = enqueue_many([(task, tuple(args), {})])
    template = int(result.id)
    if count > 1:
        columns = ", ".join(f'"{c}"' for c in _copied_columns())
        finished = "now()" if state != "ready" else "NULL"
        attempts = "1" if state != "ready" else "0"
        sql(
            f"INSERT INTO backwave_job ({columns}, state, finished_at, attempts, payload) "
            f"SELECT {columns}, %s, {finished}, {attempts}, payload FROM backwave_job, generate_series(2, %s) "
            "WHERE id = %s ORDER BY 1",
            [state, count, template],
        )
    if state != "ready":
        sql("UPDATE backwave_job SET state = %s, finished_at = now(), attempts = 1 WHERE id = %s", [state, template])


@dataclass
class Drain:
    jobs: int  # finished jobs counted
    seconds: float  # first claim to last finish (database clock)
    steady_rate: float  # jobs/s between the 10th and the 90th percentile of finish times
    first_claim: float  # epoch seconds (database clock)
    first_finish: float
    last_finish: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


def drain_figures(*, first: int | None = None) -> Drain:
    """The drain of the finished jobs on the bench queue; with ``first``, of the first ``first``
    jobs to finish only (a backlog measured over its head)."""
    limit = "" if first is None else f"LIMIT {int(first)}"
    ((jobs, claimed, first_finish, last_finish, p10, p90),) = sql(
        f"""
        WITH f AS (
            SELECT last_attempted_at, finished_at FROM backwave_job
            WHERE queue = %s AND state = 'succeeded' AND finished_at IS NOT NULL
            ORDER BY finished_at {limit}
        )
        SELECT count(*), extract(epoch FROM min(last_attempted_at)), extract(epoch FROM min(finished_at)),
               extract(epoch FROM max(finished_at)),
               extract(epoch FROM percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at)),
               extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at))
        FROM f
        """,
        [QUEUE],
    )
    if not jobs:
        return Drain(0, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"))
    claimed, first_finish, last_finish, p10, p90 = map(float, (claimed, first_finish, last_finish, p10, p90))
    steady = (0.8 * jobs) / (p90 - p10) if p90 > p10 else float("nan")
    return Drain(int(jobs), last_finish - claimed, steady, claimed, first_finish, last_finish)


def ran_once(expected: int) -> str | None:
    """None when ``expected`` jobs succeeded, each after exactly one attempt; else what went wrong."""
    ((succeeded, attempts_total, twice),) = sql(
        "SELECT count(*) FILTER (WHERE state = 'succeeded'), coalesce(sum(attempts), 0), count(*) FILTER (WHERE attempts > 1) "
        "FROM backwave_job WHERE queue = %s",
        [QUEUE],
    )
    if succeeded != expected or twice or attempts_total != expected:
        return f"expected {expected} jobs succeeded once each; {succeeded} succeeded, {attempts_total} attempts, {twice} ran more than once"
    return None


@dataclass
class Run:
    wall: float  # seconds from spawn to exit
    cpu: float  # user + system seconds of the process and the children it waited for
    output: str
    started_at: float  # time.time() at spawn (the same clock as the database's on this host)


def worker_command(
    *,
    pool_size: int = 16,
    pumps: int = 1,
    processes: int = 1,
    claim_batch: int = 32,
    until_idle: bool = True,
    extra: tuple[str, ...] = (),
) -> list[str]:
    command = [
        PYTHON,
        "manage.py",
        "backwave_worker",
        "--queues",
        QUEUE,
        "--pool-size",
        str(pool_size),
        "--pumps",
        str(pumps),
        "--max-claim-batch",
        str(claim_batch),
        "--log-every",
        "3600",
        *extra,
    ]
    if until_idle:
        command.append("--until-idle")
    if processes > 1:
        command += ["--processes", str(processes)]
    return command


def worker_env(*, synchronous_commit: bool = True, **extra: str) -> dict[str, str]:
    return {**os.environ, "BACKWAVE_WORKER_SYNCHRONOUS_COMMIT": "true" if synchronous_commit else "false", **extra}


def run(command: list[str], env: dict[str, str] | None = None, *, stop_when=None, timeout: float = 900) -> Run:
    """Run ``command`` to its end (or, with ``stop_when``, until it returns True: then SIGTERM,
    which drains a worker) and account for its CPU with wait4."""
    started_at = time.time()
    began = time.perf_counter()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}-{time.monotonic_ns()}.log"
    with open(log_path, "w+") as log:
        process = subprocess.Popen(
            command, cwd=WORKER_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        if stop_when is not None:
            while process.poll() is None and not stop_when():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        status = None
        while status is None:
            pid, code, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                status = code
                break
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
            time.sleep(0.01)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - began
        log.seek(0)
        output = log.read()
    log_path.unlink(missing_ok=True)
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({process.returncode}):\n{output[-4000:]}")
    return Run(wall=wall, cpu=usage.ru_utime + usage.ru_stime, output=output, started_at=started_at)


def run_many(commands: list[list[str]], env: dict[str, str] | None = None, timeout: float = 900) -> Run:
    """Run several processes at once to their ends; CPU summed over all of them."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started_at = time.time()
    began = time.perf_counter()
    processes = [
        subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands
    ]
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=timeout)
        outputs.append(output)
    for process in processes:
        if process.returncode != 0:
            sys.exit(f"{' '.join(process.args)} failed ({process.returncode}):\n{outputs[processes.index(process)][-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Run(wall=time.perf_counter() - began, cpu=cpu, output="".join(outputs), started_at=started_at)


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def server_cpu() -> float | None:
    """CPU seconds the PostgreSQL server has used so far: its processes alive now plus those it
    has reaped (a backend's time moves to its postmaster when it exits). None when the server
    is not a process of this host (or /proc does not tell), so the benchmark prints '-'."""
    try:
        backend = sql("SELECT pg_backend_pid()")[0][0]
        postmaster = int(_stat(backend)[1])
        fields = _stat(postmaster)
        total = sum(int(v) for v in fields[11:15])  # its own time and its reaped children's
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    child = _stat(int(entry.name))
                except (OSError, IndexError):
                    continue
                if int(child[1]) == postmaster:
                    total += int(child[11]) + int(child[12])
        return total / _TICK
    except (OSError, IndexError, ValueError):
        return None


def succeeded_count() -> int:
    return sql("SELECT count(*) FROM backwave_job WHERE queue = %s AND state = 'succeeded'", [QUEUE])[0][0]


def uptime_line() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()

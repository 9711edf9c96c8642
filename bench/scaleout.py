#!/usr/bin/env python
"""Scale-out: worker "hosts" as network namespaces on this machine, coordinated only through
PostgreSQL. Run as root (it creates namespaces, veth pairs and a bridge, and removes them at the end).

    sudo DATABASE_URL=postgres://postgres@127.0.0.1:5432/backwave_bench .venv/bin/python bench/scaleout.py
    ... bench/scaleout.py --hosts 1 2 3 --jobs 30000 --pumps 1 --pool-size 16

The network: a bridge ``bwbr0`` (10.231.0.1/24) in the host's namespace, and per host a namespace
``bw-hostN`` with one end of a veth pair (10.231.0.1N/24, default route via the bridge) and its own
hostname (a UTS namespace of its own, so the workers' ids name their host). PostgreSQL listens on
loopback only here, so a relay (socat, one process per connection) listens on the bridge address
and forwards to the server's address from the URL: every worker connection crosses a veth pair,
the bridge and the relay, like a connection from another machine on a local network (the relay
costs CPU of its own, shown beside the rest).

For 1, 2 and 3 hosts: the bench queue is filled, one ``backwave_worker --until-idle`` starts in
each host at once, and the drain rate is read from the database clock. Then every job must have
succeeded after exactly one attempt, with exactly one attempt row (no job ran twice), and the
hosts that ran them are counted from the attempt rows' worker ids.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

from common import WORKER_ROOT, drain_figures, fill, ran_once, reset, server_cpu, sql, uptime_line, worker_command, worker_env

from project.demo.tasks import noop

BRIDGE = "bwbr0"
PREFIX = "10.231.0"
BRIDGE_ADDRESS = f"{PREFIX}.1"


def sh(*command: str, check: bool = True) -> None:
    subprocess.run(command, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if not check else None)


def host_name(index: int) -> str:
    return f"bw-host{index}"


def build(hosts: int) -> None:
    teardown(hosts)
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for i in range(1, hosts + 1):
        ns, outside = host_name(i), f"bwveth{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", outside, "master", BRIDGE)
        sh("ip", "link", "set", outside, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{PREFIX}.1{i}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", BRIDGE_ADDRESS)


def teardown(hosts: int) -> None:
    for i in range(1, hosts + 1):
        sh("ip", "netns", "del", host_name(i), check=False)
        sh("ip", "link", "del", f"bwveth{i}", check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


def relay(server_host: str, server_port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "socat",
            f"TCP-LISTEN:{server_port},bind={BRIDGE_ADDRESS},fork,reuseaddr,nodelay",
            f"TCP:{server_host}:{server_port},nodelay",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def host_url(url: str) -> str:
    """The database URL as a host on the bridge sees it: the relay's address instead of the server's."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = (credentials + "@" if credentials else "") + f"{BRIDGE_ADDRESS}:{parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc))


def run_hosts(count: int, jobs: int, pumps: int, pool_size: int, url: str) -> dict:
    reset()
    fill(noop, [0], jobs)
    env = {**worker_env(), "DATABASE_URL": host_url(url)}
    command = worker_command(pool_size=pool_size, pumps=pumps)
    server_before = server_cpu()
    processes = []
    for i in range(1, count + 1):
        name = host_name(i)
        shell = f"hostname {name} && exec {' '.join(command)}"
        processes.append(
            subprocess.Popen(
                ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", shell],
                cwd=WORKER_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    cpu_before = os.times()
    for process in processes:
        output, _ = process.communicate(timeout=900)
        if process.returncode != 0:
            raise SystemExit(f"a worker failed ({process.returncode}):\n{output[-3000:]}")
    cpu_after = os.times()
    server_after = server_cpu()
    problem = ran_once(jobs)
    (attempt_rows, jobs_with_one_row) = sql(
        "SELECT count(*), count(DISTINCT job_id) FROM backwave_attempt a JOIN backwave_job j ON j.id = a.job_id WHERE j.queue = 'bench'"
    )[0]
    if problem or attempt_rows != jobs or jobs_with_one_row != jobs:
        raise SystemExit(
            f"{count} host(s): {problem or ''} {attempt_rows} attempt rows for {jobs_with_one_row} jobs (expected {jobs} of each)"
        )
    per_host = sql("SELECT split_part(worker_id, ':', 1), count(*) FROM backwave_attempt GROUP BY 1 ORDER BY 1")
    figures = drain_figures()
    workers_cpu = (cpu_after.children_user + cpu_after.children_system) - (cpu_before.children_user + cpu_before.children_system)
    return {
        "hosts": count,
        "rate": figures.rate,
        "per_host": per_host,
        "workers_cpu_us": workers_cpu / jobs * 1e6,
        "server_cpu_us": None if server_before is None or server_after is None else (server_after - server_before) / jobs * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--pumps", type=int, default=1)
    parser.add_argument("--pool-size", type=int, default=16)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("scaleout.py builds network namespaces: run it as root")
    if not shutil.which("socat"):
        sys.exit("scaleout.py relays connections with socat: apt-get install socat")
    url = os.environ["DATABASE_URL"]
    parts = urlsplit(url)
    server_host, server_port = parts.hostname or "127.0.0.1", parts.port or 5432
    most = max(args.hosts)
    build(most)
    forwarder = relay(server_host, server_port)
    time.sleep(0.3)
    try:
        print(
            f"scale-out: {args.jobs} no-op jobs, per host 1 worker process x {args.pumps} pump(s) x pool {args.pool_size}; {uptime_line()}"
        )
        print(f"{'hosts':>5} {'jobs/s':>8} {'x 1 host':>8} {'worker CPU us/job*':>18} {'server CPU us/job':>17}  jobs per host")
        first = None
        for count in args.hosts:
            r = run_hosts(count, args.jobs, args.pumps, args.pool_size, url)
            first = first or r["rate"]
            server = f"{r['server_cpu_us']:.0f}" if r["server_cpu_us"] is not None else "-"
            spread = ", ".join(f"{host} {n}" for host, n in r["per_host"])
            print(
                f"{r['hosts']:>5} {r['rate']:>8.0f} {r['rate'] / first:>8.2f} {r['workers_cpu_us']:>18.0f} {server:>17}  {spread}"
            )
        print("no job ran twice: every job succeeded after one attempt, with one attempt row")
        print("* the worker processes' CPU, start-up included, over the jobs; the relay's is not in it")
    finally:
        forwarder.terminate()
        forwarder.wait(10)
        teardown(most)
        reset()


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""The baseline every benchmark runs beside BackWave: a bare psycopg loop on the same job table.

One statement claims up to 32 due ready jobs with ``FOR UPDATE SKIP LOCKED`` (stamping
``last_attempted_at`` as BackWave's claim does), the jobs run inline, and one statement completes
the batch (``finished_at``, the return value). No leases, no attempt rows, no retries, no
signals: the least any job system on this table can do, so "BackWave / bare" says what the
engine's guarantees and its Python cost per job.

    python bench/bare.py drain [--sync off]          # until the queue is empty, then exit
    python bench/bare.py drain --jobs 100000         # the head of a backlog, then exit
    python bench/bare.py sleepers --slots 64         # jobs run on 64 threads; a finish is completed at once
    python bench/bare.py listen                      # LISTEN for BackWave's hint, claim on each; until SIGTERM
    python bench/bare.py chain                       # a chain enqueued by BackWave's chain(), link by link

Run by the other benchmarks as child processes (N processes: N children), never a test.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

CLAIM = """
WITH picked AS (
    SELECT id FROM backwave_job
    WHERE state = 'ready' AND queue = %(queue)s AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE backwave_job AS j
SET state = 'running', lease_id = %(lease)s, worker_id = %(worker)s, attempts = j.attempts + 1,
    last_attempted_at = now(), started_at = coalesce(j.started_at, now())
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.payload
"""

COMPLETE = """
UPDATE backwave_job AS j
SET state = 'succeeded', finished_at = now(), lease_id = NULL, return_value = r.value
FROM (SELECT unnest(%(ids)s::bigint[]) AS id, unnest(%(values)s::jsonb[]) AS value) AS r
WHERE j.id = r.id
"""

# A chain's link: one statement completes it and claims the job waiting on it alone (a chain's
# dependent has one ancestor), so the next link is durably claimed when this one's success
# commits: one statement and one commit a link, the least a chain on this table can cost.
NEXT_LINK = """
WITH done AS (
    UPDATE backwave_job
    SET state = 'succeeded', finished_at = now(), lease_id = NULL, return_value = %(value)s
    WHERE id = %(id)s
    RETURNING id
)
UPDATE backwave_job AS j
SET state = 'running', waiting_on = 0, lease_id = %(lease)s, worker_id = %(worker)s, attempts = j.attempts + 1,
    last_attempted_at = now(), started_at = coalesce(j.started_at, now())
FROM backwave_dependency AS d
WHERE d.ancestor_id = (SELECT id FROM done) AND j.id = d.job_id AND j.state = 'waiting' AND j.waiting_on = 1
RETURNING j.id, j.payload
"""


def noop(n):
    return n


def sleep(seconds):
    time.sleep(float(seconds))
    return seconds


def connect(url: str, synchronous_commit: bool) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=1, application_name="bench-bare")
    if not synchronous_commit:
        conn.execute("SET synchronous_commit = off")
    return conn


def run_inline(payload, function):
    return function(*payload.get("args", []), **payload.get("kwargs", {}))


class Loop:
    def __init__(self, url: str, queue_name: str, synchronous_commit: bool, batch: int):
        self.conn = connect(url, synchronous_commit)
        self.params = {"queue": queue_name, "lease": uuid.uuid4(), "worker": f"bare:{os.getpid()}"}
        self.batch = batch

    def claim(self, limit: int) -> list[tuple]:
        return self.conn.execute(CLAIM, {**self.params, "limit": limit}).fetchall()

    def complete(self, done: list[tuple[int, object]]) -> None:
        if done:
            self.conn.execute(COMPLETE, {"ids": [i for i, _ in done], "values": [Jsonb(v) for _, v in done]})


def drain(args) -> None:
    """Until the queue is empty, or (``--jobs``) that many jobs are done: a backlog's head."""
    loop = Loop(args.url, args.queue, args.sync == "on", args.batch)
    left = args.jobs or float("inf")
    while left > 0 and (rows := loop.claim(int(min(loop.batch, left)))):
        loop.complete([(job_id, run_inline(payload, noop)) for job_id, payload in rows])
        left -= len(rows)


def sleepers(args) -> None:
    """Jobs on ``slots`` threads; the main thread completes whatever has finished and claims for
    the free slots, so a slot waits for nothing but the next round-trip."""
    loop = Loop(args.url, args.queue, args.sync == "on", args.batch)
    todo: queue.SimpleQueue = queue.SimpleQueue()
    finished: queue.SimpleQueue = queue.SimpleQueue()

    def work():
        while (item := todo.get()) is not None:
            job_id, payload = item
            finished.put((job_id, run_inline(payload, sleep)))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(args.slots)]
    for thread in threads:
        thread.start()
    running = 0
    exhausted = False
    while True:
        done = []
        if running and (exhausted or running == args.slots):
            done.append(finished.get())
        while True:
            try:
                done.append(finished.get_nowait())
            except queue.Empty:
                break
        running -= len(done)
        loop.complete(done)
        if not exhausted and running < args.slots:
            rows = loop.claim(min(args.slots - running, loop.batch))
            for row in rows:
                todo.put(row)
            running += len(rows)
            exhausted = not rows
        if exhausted and not running:
            break
    for _ in threads:
        todo.put(None)


def chain(args) -> None:
    """Run a chain from its ready head to its end, each link claimed by the statement that
    completes the one before."""
    loop = Loop(args.url, args.queue, args.sync == "on", args.batch)
    link = loop.claim(1)
    while link:
        ((job_id, payload),) = link
        value = Jsonb(run_inline(payload, noop))
        link = loop.conn.execute(NEXT_LINK, {**loop.params, "id": job_id, "value": value}).fetchall()


def listen(args) -> None:
    """Claim on every hint (BackWave's own channel), as an idle BackWave worker does."""
    loop = Loop(args.url, args.queue, args.sync == "on", args.batch)
    listener = psycopg.connect(args.url, autocommit=True, application_name="bench-bare-listen")
    listener.execute("LISTEN backwave_hint")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("listening", flush=True)
    while not stop.is_set():
        if not any(True for _ in listener.notifies(timeout=0.2, stop_after=1)):
            continue
        while rows := loop.claim(loop.batch):
            loop.complete([(job_id, run_inline(payload, noop)) for job_id, payload in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["drain", "sleepers", "listen", "chain"])
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--queue", default="bench")
    parser.add_argument("--sync", choices=["on", "off"], default="on", help="synchronous_commit of the loop's session")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=0, help="drain: stop after this many jobs (0: when the queue is empty)")
    parser.add_argument("--slots", type=int, default=64)
    args = parser.parse_args()
    if not args.url:
        sys.exit("set DATABASE_URL or pass --url")
    {"drain": drain, "sleepers": sleepers, "listen": listen, "chain": chain}[args.mode](args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""BackWave's store alone: the calls one pump makes to drain the bench queue, in a loop, with no
handlers, threads, driver or signals. It opens a lease, claims a batch, then writes each batch's
outcomes and claims the next in one round-trip, as a pump at steady state does (the outcomes are
those of ``noop(0)``: it returned 0). So it is the ceiling of a one-pump worker at that batch:
the gap between it and the bare loop is the store's statements and their round-trip; between it
and the worker, the rest of BackWave.

    python bench/store_alone.py [--batch 32]   # until the queue is empty, then exit

Run by bench/throughput.py as a child process in the worker's checkout (BENCH_WORKER_ROOT, its
working directory), with the worker's environment (BACKWAVE_WORKER_SYNCHRONOUS_COMMIT); never a
test.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid

# The checkout under test is the working directory, as for the worker (manage.py runs there).
sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# bench/common.py's queue, not imported: common sets Django up from this checkout, and this
# process must load BackWave from the worker's (the working directory).
QUEUE = "bench"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)

    import django

    django.setup()
    from backwave.core.jobs import OutcomeKind
    from backwave.store.contract import OutcomeRecord
    from backwave.store.postgres import PostgresStore

    hostname = socket.gethostname()
    worker_id = f"{hostname}:{os.getpid()}:store-alone:0:{uuid.uuid4().hex[:8]}"
    lease_id = uuid.uuid4()
    with PostgresStore.from_django() as store:
        store.open_lease(
            lease_id=lease_id, worker_id=worker_id, group="store-alone", hostname=hostname, pid=os.getpid(), duration=300
        )
        jobs = store.claim_jobs(lease_id=lease_id, worker_id=worker_id, queues=[QUEUE], limit=args.batch)
        done = 0
        while jobs:
            done += len(jobs)
            outcomes = [
                OutcomeRecord(job_id=job.id, attempt=job.attempt, kind=OutcomeKind.SUCCEEDED, return_value=0) for job in jobs
            ]
            _, jobs = store.write_outcomes_then_claim(
                lease_id=lease_id, worker_id=worker_id, outcomes=outcomes, queues=[QUEUE], limit=args.batch
            )
        store.release_lease(lease_id=lease_id)
        # The worker's last line's words, which bench/throughput.py counts round-trips by.
        print(f"store alone stopped after {done} job(s) and {store.round_trips} store round-trips")


if __name__ == "__main__":
    main()

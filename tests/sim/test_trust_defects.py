"""The defects of the issue "Trust: no task's result, no lost reply and no misconfiguration may
strand, fail or hide a job", each pinned by the first seed that found it. Each is also covered
by a direct test where it is fixed; these pins keep the simulator able to find it. Those of
defects 1, 2, 6, 8 and 9 pass since their fixes landed (with them, 1,000 to 2,000 seeds of each
widening find nothing more); those of 3 and 5 fail until theirs do.

Every seed runs under CLASSIC plus the one widening that finds its defect, so that the failure
is that defect and no other. Counts were measured on the code before the fixes: "found by seed
N" is the first failing seed of 0, 1, 2, ... (so N + 1 seeds to find it), then how many of the
first 2,000 seeds fail that way. With every widening on (the default Config) the first seeds to
fail with each are 0 (defect 3), 3 (9), 11 (1), 16 (5), 30 (8) and 59 (6); with
--ambiguous-faults as well, 26 (6) and 222 (8). Defect 2 needs --ambiguous-faults, and with
everything on the others fail first: no seed of 2,000 shows it there.

1. A return value or traceback PostgreSQL cannot store halts the pump (the batched outcome write
   raises, and the next pump to claim the job halts too). --hostile-values: found by seed 16
   (17 seeds: a bare integer past 4,300 digits, ValueError in the client); seed 24 is the
   server's 22P02 on a return value with a lone surrogate, seed 47 the same on a traceback;
   495 of 2,000 seeds fail.

2. A retry due at once whose write-then-claim commits but loses its reply is claimed again under
   the same lease; the driver keeps the attempt-1 outcome, reconciles by job id (the job stays),
   the fence refuses the stale outcome, and the job sits running, never executed, under a lease
   the pump renews for ever. --tiny-backoffs --ambiguous-faults: found by seed 199 (200 seeds);
   9 of the first 5,000 fail (3 stranded jobs, 6 with more than pool_size jobs under one lease,
   the same cause). Without zero backoffs, none of 2,000 seeds finds it.

3. Pump.hint reads driver.free_slots on the listener thread while the pump thread changes the
   driver. --thread-checks: found by seed 0 (1 seed; 1,337 of 2,000 fail, every seed that
   delivers a hint). A single-threaded simulation cannot race two threads: what it checks is the
   rule (only the pump's own thread touches its driver) on its model of which thread does what,
   so it finds this because its hint listener mirrors Pump.hint; the race itself needs real
   threads (the direct test).

5. After a lease loss the driver counts the slots of handlers still running as free, and claims
   jobs that wait, unstarted, behind them for one of the pool's pool_size threads while their
   lease runs. --pool-threads: found by seed 6 (7 seeds; 53 of 2,000 fail); with
   --lease-losses too (a pump cut off from its database, hung handlers) 117 of 2,000 fail.

6. task_finished is sent inside the attempt, before the fenced write: receivers see outcomes the
   fence refuses, and those of attempts given up with a lost lease. --observers: found by seed 6
   (7 seeds; 663 of 2,000 fail). The simulator sends it where the pump does (World._answer:
   after the write, since the fix; inside the attempt before).

8. Pump._reports keeps the reports of abandoned attempts and dropped outcomes for ever.
   --report-checks: found by seed 6 (7 seeds; 244 of 2,000 fail), with the simulator's mirror of
   that map. Since the fix a report rides on its outcome and the pump keeps no map; the check
   now covers what the driver keeps of abandoned attempts.

9. A job that kills its worker process takes its batch-mates' attempts with it: they end failed
   with only "lease lapsed" attempts. --crashers: found by seed 8 (9 seeds; 328 of 2,000). Since
   the fix (suspects) the check allows what README's "What a crash costs" says a crash still
   costs (a suspect beside a crasher on another pump of the process, or on the crasher's first,
   forgiven crash): 19 of 1,000 seeds were that, and nothing else is.

What the simulator cannot find, and why:

4. Permanent connection errors (a missing database, an unknown role, bad credentials) classified
   transient. The defect is in mapping libpq's errors to transient or permanent (psycopg's
   OperationalError, with no SQLSTATE, from connect()); the simulator runs no connection and
   draws its faults already classified, so it could only restate that mapping, not test it.

7. A backend on another database is never claimed: the worker command builds its pumps for the
   `default` alias only. That wiring (Django settings to stores) is not in the simulator, which
   runs no Django: it decides itself which databases its nodes serve. It does now draw several
   databases (--max-databases) and runs every node's pumps on each, as the fixed worker will.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from backwave.testing.simulation import CLASSIC, run_seed


@pytest.mark.parametrize("seed", [16, 24, 47])
def test_a_value_postgresql_cannot_store_halts_no_pump(seed):
    run_seed(seed, replace(CLASSIC, hostile_values=True))


def test_a_lost_reply_of_a_write_then_claim_with_a_retry_due_at_once_strands_no_job():
    run_seed(199, replace(CLASSIC, tiny_backoffs=True, ambiguous_faults=True))


def test_no_other_thread_reads_a_pumps_driver():
    run_seed(0, replace(CLASSIC, thread_checks=True))


def test_a_job_claimed_after_a_lease_loss_starts_at_once():
    run_seed(6, replace(CLASSIC, pool_threads=True))


def test_task_finished_receivers_see_only_applied_outcomes():
    run_seed(6, replace(CLASSIC, observers=True))


def test_a_pump_at_rest_keeps_no_attempt_reports():
    run_seed(6, replace(CLASSIC, report_checks=True))


def test_a_job_that_kills_its_process_costs_its_batch_mates_nothing():
    run_seed(8, replace(CLASSIC, crashers=True))

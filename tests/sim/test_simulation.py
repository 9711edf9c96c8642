"""The simulator itself: a fixed budget of seeds passes, a seed replays exactly, a failing seed
names the command that replays it, and planted bugs in the store are caught.

A long hunt is run by hand: python -m backwave.testing.simulation --seeds 20000 --workers 2
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import fields, replace

from backwave.core import driver as driver_module
from backwave.core import events as ev
from backwave.testing import memory_store as memory
from backwave.testing.simulation import CLASSIC, Config, SimulationFailure, handlers, replay_command, run_seed, world
from backwave.testing.simulation.__main__ import _parser, main

CI_SEEDS = range(0, 250)  # a fixed count, not a time budget (about ten seconds on an idle machine); a hunt runs thousands by hand


def test_a_fixed_budget_of_seeds_keeps_every_invariant():
    failures = []
    for seed in CI_SEEDS:
        try:
            run_seed(seed)
        except SimulationFailure as failure:
            failures.append(str(failure))
    assert not failures, f"{len(failures)} of {len(CI_SEEDS)} seeds failed:\n\n" + "\n\n".join(failures[:3])


def test_a_budget_of_seeds_with_lost_replies_keeps_every_invariant():
    """Statements may commit and still report a fault (the connection lost after COMMIT)."""
    failures = []
    for seed in range(80):
        try:
            run_seed(seed, Config(ambiguous_faults=True))
        except SimulationFailure as failure:
            failures.append(str(failure))
    assert not failures, f"{len(failures)} of 80 seeds failed:\n\n" + "\n\n".join(failures[:3])


def test_a_budget_of_seeds_with_jobs_that_kill_their_node_keeps_every_invariant():
    """Some jobs end their process on every attempt (during the quiesce too): leases lapse with
    every job beside them, no lease ever holds two suspects, and each crasher still ends failed
    (the quiesce would report it stuck in a crash loop otherwise)."""
    failures = []
    for seed in range(80):
        try:
            run_seed(seed, replace(CLASSIC, crashers=True))
        except SimulationFailure as failure:
            failures.append(str(failure))
    assert not failures, f"{len(failures)} of 80 seeds failed:\n\n" + "\n\n".join(failures[:3])


def test_a_seed_replays_the_same_full_event_log():
    first = run_seed(1234, keep_log=True)
    second = run_seed(1234, keep_log=True)
    assert first.lines == second.lines
    assert first.digest == second.digest and len(first.lines) > 500
    assert run_seed(1235).digest != first.digest
    # The log is the whole conversation: events in, commands out, statements, faults.
    text = "\n".join(first.lines)
    for needle in ("Started()", "-> OpenLease", "db ClaimJobs", "ClaimReturned(", "JobFinished(", "OutcomesWritten(", "quiesce"):
        assert needle in text


def full_log(seed: int, config: Config = Config()) -> list[str]:
    """The whole event log of a seed, whether it passes or finds a bug."""
    try:
        return list(run_seed(seed, config, keep_log=True).lines)
    except SimulationFailure as failure:
        return [*failure.lines, failure.problem]


def test_a_seed_replays_the_same_full_event_log_with_every_widening_on():
    """Several databases, crashing and hanging jobs, hostile values, cut-off pumps: still one
    seeded source. A seed that finds a bug replays up to the same failure."""
    for seed in (1234, 30, 8):
        assert full_log(seed) == full_log(seed)
    assert full_log(1235) != full_log(1234)


def test_a_seed_replays_the_same_in_another_process_whatever_its_hash_seed():
    """The replay command runs in a fresh interpreter: nothing may depend on string hashing."""
    outputs = set()
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-m", "backwave.testing.simulation", "--seed", "77"],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        outputs.add(done.stdout.strip().rsplit("log ", 1)[-1])
    assert outputs == {run_seed(77).digest}


def test_a_widened_seed_replays_the_same_in_another_process_whatever_its_hash_seed():
    outputs = set()
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-m", "backwave.testing.simulation", "--seed", "30", "--ambiguous-faults"],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            timeout=120,
        )
        outputs.add((done.returncode, done.stdout))
    assert len(outputs) == 1


def test_a_config_replays_through_its_flags():
    assert replay_command(7) == "python -m backwave.testing.simulation --seed 7 --log"
    config = Config(ambiguous_faults=True, max_jobs=12, faults=False)
    assert (
        replay_command(7, config)
        == "python -m backwave.testing.simulation --seed 7 --no-faults --ambiguous-faults --max-jobs 12 --log"
    )


def test_every_knob_is_a_flag_and_classic_replays_through_them():
    command = replay_command(3, CLASSIC)
    for knob in (
        "hostile-values",
        "tiny-backoffs",
        "crashers",
        "lease-losses",
        "pool-threads",
        "thread-checks",
        "observers",
        "report-checks",
        "job-control",
    ):
        assert f" --no-{knob} " in command
    assert " --max-databases 1 " in command
    args = _parser().parse_args(command.split()[3:])
    assert Config(**{f.name: getattr(args, f.name) for f in fields(Config)}) == CLASSIC


def test_the_widenings_that_look_for_no_defect_of_their_own_keep_every_invariant():
    """Several databases, retries due at once and lease losses under running handlers break
    nothing on their own (they widen what the checks for defects see)."""
    config = replace(CLASSIC, tiny_backoffs=True, lease_losses=True, max_databases=2)
    failures = []
    for seed in range(60):
        try:
            run_seed(seed, config)
        except SimulationFailure as failure:
            failures.append(str(failure))
    assert not failures, f"{len(failures)} of 60 seeds failed:\n\n" + "\n\n".join(failures[:3])


def test_a_hostile_traceback_is_cut_as_the_shell_cuts_it():
    lengths = set()
    rng = random.Random(3)
    for _ in range(400):
        report = handlers.run_handler(
            rng, job_id=1, attempt=1, task_path="sim.tasks.work", result="failed", duration=0.1, hostile_rate=1.0
        )
        assert len(report.traceback) <= handlers.MAX_TRACEBACK_CHARS
        lengths.add(report.traceback.startswith("…(truncated)\n"))
    assert lengths == {True, False}  # both huge ones, cut, and short ones


def test_without_faults_every_job_finishes_too():
    for seed in range(20):
        result = run_seed(seed, Config(faults=False))
        assert result.jobs > 0


# ---- planted bugs: the invariants must catch them, and the failure must say how to replay --------


def first_failure(config: Config = Config(), seeds=range(200)) -> SimulationFailure:
    for seed in seeds:
        try:
            run_seed(seed, config)
        except SimulationFailure as failure:
            return failure
    raise AssertionError(f"no seed of {seeds} caught the planted bug")


def test_a_fence_that_ignores_the_lease_is_caught(monkeypatch):
    real_write = memory.InMemoryStore._write

    def unfenced(db, now, lease_id, rows, observed):
        # Applies any outcome of a running job, whoever holds it: a late write lands.
        for row in rows:
            job = db.jobs.get(row["job_id"])
            if job is not None and job.state == "running":
                job.lease_id, job.attempts = lease_id, row["attempt"]
                db.leases.setdefault(lease_id, next(iter(db.leases.values())))
        return real_write(db, now, lease_id, rows, observed)

    monkeypatch.setattr(memory.InMemoryStore, "_write", staticmethod(unfenced))
    # A late write needs a pump that outlived its lease with outcomes still buffered. With the
    # default knobs the first seed that has one is 6; the range leaves room for draws that move
    # (without dependencies, the config this test used to run, it was 595: twenty seconds of
    # simulation, the slowest test of the suite). It runs without job control, whose draws move
    # that seed past the range (no seed of 0..699 has one then); without it, seed 598 finds it.
    failure = first_failure(Config(job_control=False), seeds=range(700))
    caught_by = ("still runs on", "applied twice", "attempt row", "backwave_attempt_once")
    assert any(words in failure.problem for words in caught_by), failure.problem
    assert f"replay: python -m backwave.testing.simulation --seed {failure.seed} --no-job-control --log" in str(failure)


def test_an_expiry_that_forgets_the_jobs_is_caught(monkeypatch):
    def expire_only_the_leases(self, *, limit):
        with self._operation() as (db, now):
            for lease_id in [lid for lid, lease in db.leases.items() if lease.expires_at < now][:limit]:
                del db.leases[lease_id]
            return 0

    monkeypatch.setattr(memory.InMemoryStore, "expire_leases", expire_only_the_leases)
    failure = first_failure()
    assert "which no longer exists" in failure.problem, failure.problem


def test_a_claim_that_ignores_the_pool_is_caught(monkeypatch):
    real_claim = memory.InMemoryStore._claim
    monkeypatch.setattr(
        memory.InMemoryStore,
        "_claim",
        staticmethod(lambda db, now, claim: real_claim(db, now, (claim[0], {**claim[1], "limit": claim[1]["limit"] + 1}))),
    )
    failure = first_failure()
    assert (
        "claimed-and-unreported" in failure.problem or "pool_size" in failure.problem or "refused an event" in failure.problem
    ), failure.problem


def test_a_claim_that_ignores_concurrency_limits_is_caught(monkeypatch):
    monkeypatch.setattr(memory, "_room", lambda db, queue, limit, **_: limit)
    failure = first_failure()
    assert "concurrency limit" in failure.problem or "rate limit" in failure.problem, failure.problem


def test_a_claim_that_ignores_per_key_limits_is_caught(monkeypatch):
    real_claim = memory.InMemoryStore._claim

    def without_key_limits(db, now, claim):
        saved = dict(db.admission)
        db.admission.update({queue: admission._replace(key_concurrency_limit=None) for queue, admission in saved.items()})
        try:
            return real_claim(db, now, claim)
        finally:
            db.admission.clear()
            db.admission.update(saved)

    monkeypatch.setattr(memory.InMemoryStore, "_claim", staticmethod(without_key_limits))
    failure = first_failure()
    assert "per-key limit" in failure.problem, failure.problem


def _claims_forgetting(monkeypatch, windows: str) -> None:
    """A planted bug: every claim runs, then loses what it debited from the memory store's
    ``windows`` (its rate windows, or its per-key ones)."""
    real_claim = memory.InMemoryStore._claim

    def forgetting(db, now, claim):
        try:
            return real_claim(db, now, claim)
        finally:
            getattr(db, windows).clear()

    monkeypatch.setattr(memory.InMemoryStore, "_claim", staticmethod(forgetting))


def test_a_claim_that_never_debits_the_rate_window_is_caught(monkeypatch):
    _claims_forgetting(monkeypatch, "rate_windows")
    failure = first_failure()
    assert "rate limit" in failure.problem, failure.problem


def test_an_expiry_that_charges_every_batch_mate_of_a_crash_is_caught(monkeypatch):
    def expire_charging_everyone(self, *, limit):
        with self._operation() as (db, now):
            gone = {lease.id for lease in db.leases.values() if lease.expires_at < now}
            released = [job for job in db.jobs.values() if job.lease_id in gone and job.state == "running"]
            for lease_id in gone:
                del db.leases[lease_id]
            for job in released:  # every lapse counts, nobody is ever suspect
                again = job.attempts - job.forgiven_attempts < job.max_attempts
                job.state, job.lease_id = ("ready" if again else "failed"), None
                job.run_at, job.finished_at = (now, None) if again else (job.run_at, now)
                db.attempts[(job.id, job.attempts)] = memory.AttemptRow(
                    id=db.next_attempt_id(),
                    job_id=job.id,
                    number=job.attempts,
                    state="lapsed",
                    worker_id=job.worker_id,
                    started_at=job.last_attempted_at,
                    finished_at=now,
                )
            return len(released)

    monkeypatch.setattr(memory.InMemoryStore, "expire_leases", expire_charging_everyone)
    failure = first_failure(replace(CLASSIC, crashers=True), seeds=range(100))
    assert "failed although its handler never failed" in failure.problem, failure.problem


def test_a_listener_that_reads_the_driver_is_caught(monkeypatch):
    def hint_reading_the_state(self, pump):
        with self.on_thread("hint listener thread"):
            if pump.alive and pump.driver.state is not None:
                self._post(pump, ev.HintReceived)

    monkeypatch.setattr(world.World, "_hint", hint_reading_the_state)
    failure = first_failure(replace(CLASSIC, thread_checks=True), seeds=range(20))
    assert "read driver.state" in failure.problem and "only the pump's own thread" in failure.problem, failure.problem


def test_a_driver_that_never_forgets_an_abandoned_attempt_is_caught(monkeypatch):
    real = driver_module._HANDLERS[ev.JobFinished]

    def keeping(self, event):
        abandoned = (event.job_id, event.attempt) in self._abandoned
        commands = real(self, event)
        if abandoned:
            self._abandoned.add((event.job_id, event.attempt))
        return commands

    monkeypatch.setitem(driver_module._HANDLERS, ev.JobFinished, keeping)
    failure = first_failure(replace(CLASSIC, report_checks=True), seeds=range(40))
    assert "at rest and still keeps" in failure.problem, failure.problem


# ---- the command line ----------------------------------------------------------------------------


def test_the_command_line_runs_seeds_and_one_seed_with_its_log(capsys):
    assert main(["--seeds", "3", "--start", "40"]) == 0
    out = capsys.readouterr().out
    assert "3 seeds (40..42)" in out and "0 failed" in out
    assert main(["--seed", "41", "--log"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("seed 41: ok,") and "db ClaimJobs" in out


def test_the_command_line_prints_each_failure_with_its_replay(monkeypatch, capsys):
    monkeypatch.setattr(
        memory.InMemoryStore, "_write", staticmethod(lambda db, now, lease_id, rows, observed: set())
    )  # no outcome ever lands
    assert main(["--seeds", "2", "--quiesce-limit", "20.0"]) == 1
    out = capsys.readouterr().out
    assert "replay: python -m backwave.testing.simulation --seed 0 --quiesce-limit 20.0 --log" in out
    assert "2 failed" in out


def test_a_dependent_released_at_enqueue_is_caught(monkeypatch):
    """The invariant "a dependent never runs before all its ancestors succeeded": a store that
    forgets to make dependents wait is caught."""
    real_enqueue = memory.InMemoryStore.enqueue_many

    def never_waits(self, jobs):
        ids = real_enqueue(self, jobs)
        for job_id in ids:
            self.database.jobs[job_id].state = "ready"
        return ids

    monkeypatch.setattr(memory.InMemoryStore, "enqueue_many", never_waits)
    failure = first_failure()
    assert "a dependent ran before all its ancestors succeeded" in failure.problem, failure.problem


def test_a_claim_that_never_debits_the_key_rate_windows_is_caught(monkeypatch):
    _claims_forgetting(monkeypatch, "key_rate_windows")
    failure = first_failure()
    assert "per-key rate limit" in failure.problem, failure.problem

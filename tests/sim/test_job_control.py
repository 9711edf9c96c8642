"""What the simulator draws with job control (Config.job_control): tasks with time limits and
a hard limit, cancels at random moments, snoozes, unique tasks, named observers, and handlers
that outlive their attempt. Each test plants a defect back and asserts a seed of a small range
finds it, naming its invariant.

Defect 5 of issue 32 ("per-key and queue limits after a time limit or a late cancel"): the claim
counted only running rows, so a handler still running past its ended attempt let another of its
key start. Planted back as the old claim (no overrun row counts), the first seed of 0, 1, 2, ...
to find it is 1 ("2 handlers of key 'k2' run at once in queue q2 (1 of them of attempts already
ended ...); its per-key limit is 1"), then 8 (a per-key limit), 13 and 16 (a queue's concurrency
limit) and 24 of the first 25.
"""

from __future__ import annotations

from backwave.testing import memory_store as memory
from backwave.testing.simulation import Config, SimulationFailure, run_seed


def first_failure(config: Config = Config(), seeds=range(60)) -> SimulationFailure:
    for seed in seeds:
        try:
            run_seed(seed, config)
        except SimulationFailure as failure:
            return failure
    raise AssertionError(f"no seed of {seeds} caught the planted defect")


def test_claims_that_count_only_running_rows_are_caught(monkeypatch):
    """Defect 5 planted back: handlers past their time limit or an ignored cancel count for nothing."""
    monkeypatch.setattr(memory.MemoryDatabase, "live_overruns", lambda self, now: [])
    failure = first_failure()
    assert "handlers of" in failure.problem and "already ended" in failure.problem, failure.problem
    assert "per-key limit" in failure.problem or "concurrency limit" in failure.problem, failure.problem


def test_the_seed_that_finds_defect_5_passes_since_its_fix():
    run_seed(1)


def test_a_claim_that_forgets_a_cancel_request_is_caught(monkeypatch):
    """A job whose cancel was requested while it ran, and whose attempt then ended without an
    outcome (its worker died, it was given back), must be cancelled by the next claim, never run."""
    real_claim = memory.InMemoryStore._claim

    def forgetting(db, now, claim):
        jobs = real_claim(db, now, claim)
        for job in jobs:
            job.cancel_requested_by = None
        return jobs

    monkeypatch.setattr(memory.InMemoryStore, "_claim", staticmethod(forgetting))
    failure = first_failure(seeds=range(300))
    assert "a cancelled job ran again" in failure.problem, failure.problem


def test_an_enqueue_that_ignores_uniqueness_is_caught(monkeypatch):
    monkeypatch.setattr(memory, "_stored_unique_key", lambda row, now: None)
    failure = first_failure()
    assert "two jobs hold one key" in failure.problem or "uniqueness key" in failure.problem, failure.problem


def test_a_cancel_noted_for_no_observer_is_caught(monkeypatch):
    real_note = memory._note
    monkeypatch.setattr(
        memory,
        "_note",
        lambda db, now, observed, job, attempt, kind: (
            None if kind == "cancelled" else real_note(db, now, observed, job, attempt, kind)
        ),
    )
    failure = first_failure()
    assert "reached no observer" in failure.problem, failure.problem

"""Dispatch policies as traces: Strict asks once over all its queues; Weighted shares the
capacity by smooth weighted round-robin, one claim per queue, and is work-conserving."""

from __future__ import annotations

from collections import Counter

import pytest

from backwave.core import commands as cmd
from backwave.core.policy import Strict, Weighted

from .helpers import LEASE, MAINTENANCE, Trace, of_type


def test_strict_claims_all_its_queues_in_one_claim():
    t = Trace(policy=Strict("high", "low"), pool_size=8)
    t.started()
    assert t.opened(LEASE) == [cmd.ClaimJobs(lease_id=LEASE, queues=("high", "low"), limit=8), *MAINTENANCE]


def test_weighted_splits_the_first_pass_by_weight_one_claim_per_queue():
    t = Trace(policy=Weighted({"a": 3, "b": 1}), pool_size=8)
    t.started()
    claims = of_type(t.opened(LEASE), cmd.ClaimJobs)
    assert claims == [
        cmd.ClaimJobs(lease_id=LEASE, queues=("a",), limit=6),
        cmd.ClaimJobs(lease_id=LEASE, queues=("b",), limit=2),
    ]


@pytest.mark.parametrize("weights", [{"a": 3, "b": 1}, {"a": 1, "b": 1, "c": 1}, {"a": 5, "b": 2, "c": 1}, {"a": 100, "b": 1}])
def test_weighted_long_run_shares_follow_the_weights_within_one_percent(weights):
    """Every queue has an endless backlog: each claim comes back full, every job finishes at once."""
    t = Trace(policy=Weighted(weights), pool_size=10, max_claim_batch=10)
    t.started()
    pending = of_type(t.opened(LEASE), cmd.ClaimJobs)
    claimed: Counter[str] = Counter()

    def run(commands):
        # In the order the pump runs them: a write lands before the claim that rides it.
        for command in commands:
            if isinstance(command, cmd.WriteOutcomes):
                run(t.written({o.job_id for o in command.outcomes}))
            elif isinstance(command, cmd.ClaimJobs):
                pending.append(command)

    while sum(claimed.values()) < 20_000:
        assert pending, "the driver stopped claiming with work waiting"
        claim_command = pending.pop(0)
        (queue,) = claim_command.queues
        jobs = t.jobs.make(claim_command.limit, queue=queue)
        claimed[queue] += len(jobs)
        run(t.returned(*jobs))
        for job in jobs:
            run(t.finished(job))
    total = sum(claimed.values())
    weight_total = sum(weights.values())
    for queue, weight in weights.items():
        assert abs(claimed[queue] / total - weight / weight_total) < 0.01, (queue, claimed)


def test_weighted_never_starves_a_light_queue():
    """Over any window of 101 consecutive slots with weights 100:1, the light queue gets one."""
    policy = Weighted({"heavy": 100, "light": 1})
    state: dict[str, int] = {}
    sequence = []
    for _ in range(1010):
        (((queue,), _),) = policy.plan(1, state)
        sequence.append(queue)
    for start in range(0, len(sequence) - 101):
        assert "light" in sequence[start : start + 101]


def test_an_idle_queues_share_goes_to_the_busy_queue_at_once():
    t = Trace(policy=Weighted({"a": 1, "b": 1}), pool_size=8)
    t.started()
    a_claim, b_claim = of_type(t.opened(LEASE), cmd.ClaimJobs)
    assert (a_claim.queues, a_claim.limit, b_claim.queues, b_claim.limit) == (("a",), 4, ("b",), 4)
    assert t.returned(*t.jobs.make(4, queue="a")) != []  # four ExecuteJob, the pass not over yet
    out = t.returned()  # b is empty
    # Work-conserving: the four free slots are claimed again at once, from a alone.
    assert of_type(out, cmd.ClaimJobs) == [cmd.ClaimJobs(lease_id=LEASE, queues=("a",), limit=4)]


def test_all_queues_short_means_wait_for_the_poll():
    t = Trace(policy=Weighted({"a": 1, "b": 1}), pool_size=8, poll_interval=5.0)
    t.started()
    t.opened(LEASE, now=0.0)
    t.returned(*t.jobs.make(1, queue="a"), now=0.1)
    assert of_type(t.returned(now=0.2), cmd.ClaimJobs) == []
    assert t.driver.next_wakeup() == pytest.approx(5.2)


@pytest.mark.parametrize("bad", [{}, {"a": 0}, {"a": 1.5}, {"a": True}, ["a"]])
def test_weighted_rejects_bad_weights(bad):
    with pytest.raises(ValueError, match="Weighted"):
        Weighted(bad)


def test_a_policy_restricted_to_some_queues_keeps_their_order_and_weights():
    assert Strict("a", "b", "c").only({"c", "a", "elsewhere"}) == Strict("a", "c")
    assert Weighted({"a": 3, "b": 1, "c": 2}).only(["c", "b"]) == Weighted({"b": 1, "c": 2})
    with pytest.raises(ValueError, match="at least one queue"):
        Strict("a").only(["b"])

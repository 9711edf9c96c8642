"""WorkerGroupOptions defaults, the derived dials, group validation and the Strict policy."""

from __future__ import annotations

import dataclasses

import pytest

from backwave.core.options import WorkerGroupConfigError, WorkerGroupOptions, validate_groups
from backwave.core.policy import DispatchPolicy, Strict


def test_defaults_are_the_documented_ones():
    options = WorkerGroupOptions(name="emails")
    assert options.policy == Strict("default")
    assert options.pool_size == 20
    assert options.pumps == 1
    assert options.max_claim_batch == 32
    assert options.max_outcome_batch is None
    assert options.heartbeat_interval is None
    assert options.poll_interval == 1.0
    assert options.lease_duration == 30.0
    assert options.maintenance_interval == 30.0
    assert options.drain_timeout == 30.0


def test_outcome_batch_falls_back_to_max_claim_batch():
    assert WorkerGroupOptions(name="g").outcome_batch == 32
    assert WorkerGroupOptions(name="g", max_claim_batch=7).outcome_batch == 7
    assert WorkerGroupOptions(name="g", max_claim_batch=7, max_outcome_batch=3).outcome_batch == 3
    assert WorkerGroupOptions(name="g", max_claim_batch=7, max_outcome_batch=50).outcome_batch == 50


def test_heartbeat_defaults_to_a_third_of_the_lease():
    assert WorkerGroupOptions(name="g").heartbeat_every == 10.0
    assert WorkerGroupOptions(name="g", lease_duration=9.0).heartbeat_every == 3.0
    assert WorkerGroupOptions(name="g", lease_duration=9.0, heartbeat_interval=2.5).heartbeat_every == 2.5


def test_options_are_frozen_and_keyword_only():
    options = WorkerGroupOptions(name="g")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.pool_size = 5
    with pytest.raises(TypeError):
        WorkerGroupOptions("g")  # positional: refused
    with pytest.raises(TypeError):
        WorkerGroupOptions()  # name is required


def test_each_group_gets_its_own_default_policy_value():
    a, b = WorkerGroupOptions(name="a"), WorkerGroupOptions(name="b")
    assert a.policy == b.policy == Strict("default")
    assert a.policy.queues == ("default",)


# ---- validate_groups: the seeds' two messages, word for word ------------------------------------


def test_valid_groups_come_back_in_order():
    groups = [WorkerGroupOptions(name="a"), WorkerGroupOptions(name="b", pumps=4)]
    assert validate_groups(groups) == groups
    assert validate_groups(iter(groups)) == groups  # any iterable
    assert validate_groups([]) == []


def test_duplicate_group_name_message_is_exact():
    with pytest.raises(WorkerGroupConfigError) as caught:
        validate_groups([WorkerGroupOptions(name="x"), WorkerGroupOptions(name="y"), WorkerGroupOptions(name="x", pool_size=3)])
    assert str(caught.value) == "Worker Group 'x' is configured twice."


@pytest.mark.parametrize("pumps", [0, -1])
def test_too_few_pumps_message_is_exact(pumps):
    with pytest.raises(WorkerGroupConfigError) as caught:
        validate_groups([WorkerGroupOptions(name="x", pumps=pumps)])
    assert str(caught.value) == f"Worker Group 'x' must run at least one Pump (Pumps = {pumps})."


def test_pumps_zero_message_for_the_seed_example():
    with pytest.raises(WorkerGroupConfigError, match=r"^Worker Group 'x' must run at least one Pump \(Pumps = 0\)\.$"):
        validate_groups([WorkerGroupOptions(name="x", pumps=0)])


def test_config_error_is_a_value_error():
    assert issubclass(WorkerGroupConfigError, ValueError)


def test_the_other_dials_carry_no_upper_bound():
    """Like the seeds: pool size, batches and intervals are the operator's to set."""
    big = WorkerGroupOptions(name="big", pool_size=10_000, max_claim_batch=5_000, max_outcome_batch=9_999, pumps=64)
    assert validate_groups([big]) == [big]


def test_the_first_error_wins_and_nothing_is_returned():
    groups = [WorkerGroupOptions(name="x", pumps=0), WorkerGroupOptions(name="x")]
    with pytest.raises(WorkerGroupConfigError, match="must run at least one Pump"):
        validate_groups(groups)


# ---- Strict -------------------------------------------------------------------------------------


def test_strict_keeps_queue_order():
    policy = Strict("high", "default", "low")
    assert policy.queues == ("high", "default", "low")
    assert isinstance(policy, DispatchPolicy)
    assert repr(policy) == "Strict('high', 'default', 'low')"


def test_strict_is_a_frozen_value():
    assert Strict("a", "b") == Strict("a", "b")
    assert Strict("a", "b") != Strict("b", "a")
    assert hash(Strict("a")) == hash(Strict("a"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Strict("a").queues = ("b",)


def test_strict_needs_a_queue():
    with pytest.raises(ValueError, match=r"^Strict\(\) needs at least one queue name$"):
        Strict()


def test_strict_refuses_a_queue_named_twice():
    with pytest.raises(ValueError, match=r"names a queue twice: \('a', 'b', 'a'\)"):
        Strict("a", "b", "a")

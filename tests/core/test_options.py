"""WorkerGroupOptions defaults, the derived dials, group validation and the Strict policy."""

from __future__ import annotations

import dataclasses

import pytest

from backwave.core.options import StoreTimeouts, WorkerGroupConfigError, WorkerGroupOptions, store_timeouts, validate_groups
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
    """Like the seeds: pool size and batches are the operator's to set (intervals: see below)."""
    big = WorkerGroupOptions(name="big", pool_size=10_000, max_claim_batch=5_000, max_outcome_batch=9_999, pumps=64)
    assert validate_groups([big]) == [big]


def test_the_first_error_wins_and_nothing_is_returned():
    groups = [WorkerGroupOptions(name="x", pumps=0), WorkerGroupOptions(name="x")]
    with pytest.raises(WorkerGroupConfigError, match="must run at least one Pump"):
        validate_groups(groups)


# ---- intervals ---------------------------------------------------------------------------------

INTERVALS = ("poll_interval", "lease_duration", "heartbeat_interval", "maintenance_interval", "drain_timeout")


@pytest.mark.parametrize("name", INTERVALS)
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), float("-inf"), 8 * 86_400.0, "5", True])
def test_an_interval_must_be_a_finite_positive_number_of_seconds_up_to_a_week(name, value):
    group = WorkerGroupOptions(name="x", **{"lease_duration": 60.0, name: value})
    with pytest.raises(WorkerGroupConfigError) as caught:
        validate_groups([group])
    assert (
        str(caught.value)
        == f"Worker Group 'x': {name} must be a number of seconds above 0 and at most 604,800 (a week), got {value!r}."
    )


def test_a_week_and_tiny_positive_intervals_are_accepted():
    week = 7 * 86_400.0
    groups = [
        WorkerGroupOptions(name="slow", poll_interval=week, lease_duration=week, maintenance_interval=week, drain_timeout=week),
        WorkerGroupOptions(name="fast", poll_interval=0.001, lease_duration=0.3, heartbeat_interval=0.1, drain_timeout=0.001),
    ]
    assert validate_groups(groups) == groups


@pytest.mark.parametrize("heartbeat", [27.0, 30.0, 45.0])
def test_a_heartbeat_must_come_before_the_pump_stops_trusting_its_lease(heartbeat):
    with pytest.raises(WorkerGroupConfigError) as caught:
        validate_groups([WorkerGroupOptions(name="x", lease_duration=30.0, heartbeat_interval=heartbeat)])
    assert str(caught.value) == (
        f"Worker Group 'x': heartbeat_interval ({heartbeat:g} s) must be below 90% of lease_duration (27 of 30 s), "
        "where the pump stops trusting a lease it has not renewed; leave it None for a third of the lease."
    )


def test_a_heartbeat_just_below_the_fence_is_accepted():
    group = WorkerGroupOptions(name="x", lease_duration=30.0, heartbeat_interval=26.9)
    assert validate_groups([group]) == [group]


# ---- store timeouts -----------------------------------------------------------------------------


def test_store_timeouts_follow_the_shortest_lease():
    groups = [WorkerGroupOptions(name="long", lease_duration=120.0), WorkerGroupOptions(name="short", lease_duration=15.0)]
    assert store_timeouts(groups) == StoreTimeouts(statement=3.0, lock=1.0)
    assert store_timeouts([]) == StoreTimeouts(statement=6.0, lock=2.0)  # the default lease: 30 s


def test_store_timeouts_given_are_kept():
    groups = [WorkerGroupOptions(name="g", lease_duration=30.0)]
    assert store_timeouts(groups, statement_timeout=15, lock_timeout=0.5) == StoreTimeouts(statement=15.0, lock=0.5)
    assert store_timeouts(groups, statement_timeout=9.0) == StoreTimeouts(statement=9.0, lock=3.0)
    assert store_timeouts(groups, lock_timeout=6.0) == StoreTimeouts(statement=6.0, lock=6.0)
    # No groups (a store outside a worker): no lease to hold the values against.
    assert store_timeouts([], statement_timeout=100.0) == StoreTimeouts(statement=100.0, lock=pytest.approx(100 / 3))


def test_a_statement_timeout_above_half_the_shortest_lease_is_refused():
    groups = [WorkerGroupOptions(name="long", lease_duration=120.0), WorkerGroupOptions(name="short", lease_duration=10.0)]
    with pytest.raises(WorkerGroupConfigError) as caught:
        store_timeouts(groups, statement_timeout=5.5)
    assert str(caught.value) == (
        "BACKWAVE['WORKER_STATEMENT_TIMEOUT'] (5.5 s) must be at most half the lease_duration of Worker Group 'short' (10 s): "
        "a heartbeat waiting behind a statement that long would come too late to keep the lease. Lower it, lengthen the lease, "
        "or leave it None (a fifth of the shortest lease)."
    )


def test_a_lock_timeout_above_the_statement_timeout_is_refused():
    with pytest.raises(WorkerGroupConfigError) as caught:
        store_timeouts([WorkerGroupOptions(name="g")], lock_timeout=7.0)
    assert str(caught.value) == (
        "BACKWAVE['WORKER_LOCK_TIMEOUT'] (7 s) must be at most the statement timeout (6 s), which cuts a longer lock wait "
        "first. Lower it, or leave it None (a third of the statement timeout)."
    )


@pytest.mark.parametrize("setting", ["WORKER_STATEMENT_TIMEOUT", "WORKER_LOCK_TIMEOUT"])
@pytest.mark.parametrize("value", [0, -2.0, float("nan"), float("inf"), "5", False])
def test_a_store_timeout_must_be_a_positive_number_of_seconds(setting, value):
    keyword = {"WORKER_STATEMENT_TIMEOUT": "statement_timeout", "WORKER_LOCK_TIMEOUT": "lock_timeout"}[setting]
    with pytest.raises(WorkerGroupConfigError) as caught:
        store_timeouts([WorkerGroupOptions(name="g")], **{keyword: value})
    assert (
        str(caught.value)
        == f"BACKWAVE[{setting!r}] must be a number of seconds above 0 or None (derived from the lease), got {value!r}."
    )


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


@pytest.mark.parametrize("linger", [-0.001, float("nan"), float("inf"), 61.0, True, "2ms"])
def test_an_outcome_linger_outside_zero_to_a_minute_is_refused(linger):
    with pytest.raises(WorkerGroupConfigError, match="outcome_linger must be a number of seconds from 0"):
        validate_groups([WorkerGroupOptions(name="g", outcome_linger=linger)])


def test_an_outcome_linger_of_zero_writes_at_once_and_the_default_is_ten_milliseconds():
    assert validate_groups([WorkerGroupOptions(name="g", outcome_linger=0)])[0].outcome_linger == 0
    assert WorkerGroupOptions(name="g").outcome_linger == 0.010


def test_a_settings_group_takes_an_outcome_linger_of_zero_and_refuses_a_negative_one():
    from backwave.conf import group_from_mapping

    assert group_from_mapping({"name": "g", "outcome_linger": 0}).outcome_linger == 0.0
    assert group_from_mapping({"name": "g", "outcome_linger": 0.01}).outcome_linger == 0.01
    with pytest.raises(WorkerGroupConfigError, match="outcome_linger must be a positive number of seconds"):
        group_from_mapping({"name": "g", "outcome_linger": -1})

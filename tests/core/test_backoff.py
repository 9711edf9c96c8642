"""retry_delay: the ceiling doubles from base up to cap; the delay is drawn from its upper half."""

from __future__ import annotations

import math

import pytest

from backwave.core.backoff import MAX_DELAY, retry_delay


def delay(attempt, base=1.0, cap=1000.0, jitter=0.0):
    return retry_delay(attempt=attempt, base=base, cap=cap, jitter=jitter)


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (10, 1024.0)])
def test_ceiling_doubles_per_attempt(attempt, ceiling):
    # jitter 0 gives the floor (half the ceiling); jitter near 1 approaches the ceiling.
    assert delay(attempt, base=2.0, cap=10_000.0, jitter=0.0) == ceiling / 2
    assert delay(attempt, base=2.0, cap=10_000.0, jitter=0.5) == ceiling * 0.75


def test_growth_is_exponential_at_fixed_jitter():
    delays = [delay(a, base=0.5, cap=1e9, jitter=0.3) for a in range(1, 12)]
    ratios = {round(b / a, 12) for a, b in zip(delays, delays[1:])}
    assert ratios == {2.0}


def test_cap_bounds_the_ceiling():
    assert delay(1, base=5.0, cap=60.0) == 2.5
    assert delay(4, base=5.0, cap=60.0) == 20.0  # ceiling 40
    assert delay(5, base=5.0, cap=60.0) == 30.0  # ceiling 80 -> 60
    assert delay(50, base=5.0, cap=60.0) == 30.0
    assert delay(50, base=5.0, cap=60.0, jitter=0.999999) == pytest.approx(60.0, abs=1e-4)


def test_cap_below_base_wins_from_the_first_attempt():
    assert delay(1, base=100.0, cap=10.0, jitter=0.0) == 5.0


def test_huge_attempt_numbers_do_not_overflow():
    value = delay(10**9, base=1.0, cap=3600.0, jitter=0.25)
    assert math.isfinite(value)
    assert value == 1800.0 + 1800.0 * 0.25
    assert math.isfinite(delay(10**9, base=1.0, cap=math.inf, jitter=0.0))


@pytest.mark.parametrize("jitter", [0.0, 1e-9, 0.25, 0.5, 0.75, 0.999999999])
@pytest.mark.parametrize("attempt", [1, 2, 5, 30])
def test_jitter_stays_in_the_upper_half(attempt, jitter):
    base, cap = 3.0, 500.0
    ceiling = min(cap, base * 2 ** (attempt - 1))
    value = delay(attempt, base=base, cap=cap, jitter=jitter)
    assert ceiling / 2 <= value < ceiling


def test_jitter_is_monotonic():
    values = [delay(3, base=1.0, cap=100.0, jitter=j / 100) for j in range(100)]
    assert values == sorted(values)
    assert len(set(values)) == 100


def test_deterministic_for_the_same_inputs():
    assert delay(4, base=1.5, cap=30.0, jitter=0.123) == delay(4, base=1.5, cap=30.0, jitter=0.123)


def test_zero_base_means_no_wait():
    assert delay(7, base=0.0, cap=10.0, jitter=0.9) == 0.0
    assert delay(7, base=1.0, cap=0.0, jitter=0.9) == 0.0


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_attempt_must_be_positive(attempt):
    with pytest.raises(ValueError, match=rf"^attempt must be 1 or more, got {attempt}$"):
        delay(attempt)


@pytest.mark.parametrize("jitter", [1.0, 1.5, -0.0001, -1.0, math.nan, math.inf])
def test_jitter_must_be_in_unit_interval(jitter):
    with pytest.raises(ValueError, match=r"^jitter must be in \[0, 1\), got "):
        delay(1, jitter=jitter)


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 10.0), (1.0, -10.0), (-1.0, -1.0)])
def test_negative_base_or_cap_is_refused(base, cap):
    with pytest.raises(ValueError, match=rf"^backoff base and cap must not be negative \(base={base}, cap={cap}\)$"):
        delay(1, base=base, cap=cap)


def test_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        retry_delay(1, 1.0, 10.0, 0.0)


def test_no_cap_lets_the_ceiling_pass_the_maximum_delay():
    assert delay(62, base=1.0, cap=1e300, jitter=0.0) == MAX_DELAY / 2
    assert delay(1, base=1e15, cap=1e300, jitter=0.999999) == pytest.approx(MAX_DELAY, rel=1e-5)

"""The ledger of commands in flight: sent, settled oldest first, and stale once their lease is lost."""

from __future__ import annotations

import copy

import pytest

from backwave.core import commands as cmd
from backwave.core.ledger import Ledger

from .helpers import LEASE, claim


def test_a_sent_command_is_in_flight_until_it_lands():
    ledger = Ledger()
    renew = cmd.RenewLease(lease_id=LEASE)
    assert not ledger.busy(cmd.RenewLease)
    assert ledger.oldest(cmd.RenewLease) is None
    assert ledger.send(renew, 4.0) is renew
    assert ledger.busy(cmd.RenewLease) and not ledger.busy(cmd.OpenLease)
    assert ledger.oldest(cmd.RenewLease) is renew
    assert ledger.landed(cmd.RenewLease) == (renew, 4.0)  # with when it was sent
    assert not ledger.busy(cmd.RenewLease)


def test_commands_of_one_kind_settle_oldest_first_whether_they_land_or_fail():
    ledger = Ledger()
    first, second, third = claim(3, queues=("a",)), claim(2, queues=("b",)), claim(1, queues=("c",))
    for at, command in enumerate((first, second, third)):
        ledger.send(command, float(at))
    assert list(ledger.sent(cmd.ClaimJobs)) == [(first, 0.0), (second, 1.0), (third, 2.0)]
    assert ledger.failed(cmd.ClaimJobs) == (first, 0.0)
    assert ledger.landed(cmd.ClaimJobs) == (second, 1.0)
    assert list(ledger.sent(cmd.ClaimJobs)) == [(third, 2.0)]  # with when each was sent
    assert list(ledger.sent(cmd.WriteOutcomes)) == []  # a kind never sent has nothing in flight


def test_settling_a_kind_with_nothing_in_flight_is_an_error():
    ledger = Ledger()
    with pytest.raises(LookupError, match="no WriteOutcomes is in flight"):
        ledger.landed(cmd.WriteOutcomes)
    ledger.send(cmd.OpenLease(), 0.0)
    ledger.landed(cmd.OpenLease)
    with pytest.raises(LookupError, match="no OpenLease is in flight"):
        ledger.failed(cmd.OpenLease)


def test_a_lost_lease_turns_what_is_in_flight_into_stale_results_of_the_kinds_named():
    ledger = Ledger()
    ledger.send(claim(2), 0.0)
    ledger.send(claim(3), 0.0)
    ledger.send(cmd.RenewLease(lease_id=LEASE), 0.0)
    ledger.send(cmd.PurgeJobs(retention=None, limit=10), 0.0)
    ledger.lease_lost([cmd.ClaimJobs, cmd.RenewLease, cmd.WriteOutcomes])
    assert not ledger.busy(cmd.ClaimJobs) and not ledger.busy(cmd.RenewLease)
    assert ledger.busy(cmd.PurgeJobs)  # not named: still waited for
    # Each stale result is swallowed once, in the order they come.
    assert [ledger.swallow_stale(cmd.ClaimJobs) for _ in range(3)] == [True, True, False]
    assert ledger.swallow_stale(cmd.RenewLease) is True
    assert ledger.swallow_stale(cmd.RenewLease) is False
    assert ledger.swallow_stale(cmd.WriteOutcomes) is False  # none was in flight


def test_a_result_is_not_stale_while_a_command_of_its_kind_is_in_flight_again():
    ledger = Ledger()
    ledger.send(cmd.RenewLease(lease_id=LEASE), 0.0)
    ledger.lease_lost([cmd.RenewLease])
    ledger.send(cmd.RenewLease(lease_id=LEASE), 5.0)
    assert ledger.swallow_stale(cmd.RenewLease) is False  # the new renewal's answer
    assert ledger.landed(cmd.RenewLease)[1] == 5.0
    assert ledger.swallow_stale(cmd.RenewLease) is True  # still due afterwards


def test_ledgers_compare_and_copy_by_value():
    """The driver's tests compare a deep copy of its state before and after a refused event."""
    ledger = Ledger()
    ledger.send(claim(2), 1.0)
    ledger.lease_lost([cmd.ClaimJobs])
    ledger.send(claim(1), 2.0)
    copied = copy.deepcopy(ledger)
    assert copied == ledger
    copied.landed(cmd.ClaimJobs)
    assert copied != ledger

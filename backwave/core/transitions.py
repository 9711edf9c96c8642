"""The Node Driver's transition table as data: which events each lifecycle state accepts.

``NodeDriver.handle`` consults ``ACCEPTS`` once, before any handler runs, so a handler checks only
its event's own preconditions (a command of its kind in flight, numbers that add up). What each
accepted pair does is the table in driver.py's docstring; tests/core/test_transitions.py holds
that table and this data equal, both ways. A new event is one entry here and one row there.
"""

from __future__ import annotations

import enum

from . import commands as cmd
from . import events as ev


class State(enum.Enum):
    NEW = "NEW"
    OPENING = "OPENING"
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"


class InvalidEvent(Exception):
    """The driver cannot accept this event in its current state; nothing was changed."""

    def __init__(self, event: ev.Event, state: State, reason: str):
        self.event = event
        self.state = state
        super().__init__(f"{type(event).__name__} cannot be accepted in state {state.value}: {reason}")

    @classmethod
    def refused(cls, event: ev.Event, state: State) -> InvalidEvent:
        """The table does not list ``event`` in ``state``."""
        return cls(event, state, f"accepted only in {', '.join(s.value for s in accepting(type(event)))}")


# Results of maintenance, which is not bound to the lease: they may land in any state but NEW.
_MAINTENANCE_RESULTS = frozenset({ev.LeasesExpired, ev.SchedulesMinted, ev.PumpsPurged, ev.JobsPurged})
# What every state but NEW takes: timers, hints, handlers returning, faults, maintenance, a drain.
_LIVE = frozenset({ev.Tick, ev.HintReceived, ev.JobFinished, ev.StoreFailed, ev.DrainRequested}) | _MAINTENANCE_RESULTS
# Answers to commands sent under a held lease.
_UNDER_LEASE = frozenset({ev.ClaimReturned, ev.OutcomesWritten, ev.LeaseRenewed, ev.JobsReleased, ev.LeaseReconciled})

ACCEPTS: dict[State, frozenset[type[ev.Event]]] = {
    State.NEW: frozenset({ev.Started, ev.DrainRequested}),
    State.OPENING: _LIVE | {ev.LeaseOpened, ev.OutcomesWritten},
    State.RUNNING: _LIVE | _UNDER_LEASE,
    State.DRAINING: _LIVE | _UNDER_LEASE | {ev.LeaseReleased},
    State.STOPPED: _LIVE | {ev.LeaseOpened},
}

# The command each store result answers. Every one of them ends a streak of transient faults.
ANSWERS: dict[type[ev.Event], type[cmd.Command]] = {
    ev.LeaseOpened: cmd.OpenLease,
    ev.ClaimReturned: cmd.ClaimJobs,
    ev.OutcomesWritten: cmd.WriteOutcomes,
    ev.LeaseRenewed: cmd.RenewLease,
    ev.LeasesExpired: cmd.ExpireLeases,
    ev.SchedulesMinted: cmd.MintSchedules,
    ev.JobsPurged: cmd.PurgeJobs,
    ev.PumpsPurged: cmd.PurgePumps,
    ev.JobsReleased: cmd.ReleaseJobs,
    ev.LeaseReconciled: cmd.ReconcileLease,
    ev.LeaseReleased: cmd.ReleaseLease,
}
STORE_RESULTS = frozenset(ANSWERS)

# Commands whose result may still arrive after the driver gave their lease up (a lost lease, a
# self-fence, a drain's end). Such a stale result, or its StoreFailed, is swallowed on arrival
# in any state, before ACCEPTS is consulted, while no command of its kind is in flight: the
# store's fence makes whatever it did a no-op.
STALE_TOLERANT = frozenset({cmd.ClaimJobs, cmd.WriteOutcomes, cmd.RenewLease, cmd.ReconcileLease, cmd.ReleaseLease})

# Store commands the driver waits for none of: a StoreFailed of one is always accepted, and the
# next maintenance run (or the lease's lapse) makes up for it.
UNTRACKED = frozenset({cmd.ExpireLeases, cmd.MintSchedules, cmd.PurgePumps, cmd.ReleaseJobs})


def answered_by(event: ev.Event) -> type | None:
    """The command type whose outcome ``event`` reports, if it reports one."""
    if isinstance(event, ev.StoreFailed):
        return type(event.command)
    return ANSWERS.get(type(event))


def accepting(event_type: type[ev.Event]) -> tuple[State, ...]:
    """The states that accept ``event_type``, in lifecycle order."""
    return tuple(state for state in State if event_type in ACCEPTS[state])

"""The Node Driver's transition table, in prose and as data.

``NodeDriver.handle`` consults ``ACCEPTS`` once, before any handler runs, and refuses the result
of a command it waits for (``AWAITED``) unless one is in flight; a handler checks only its
event's own preconditions (numbers that add up, jobs it knows).
tests/core/test_transitions.py holds the prose table below and this data equal, both ways: a new
event is one row below and one entry in ``ACCEPTS``.

Lifecycle states, the events each accepts, and what each accepted event does::

    state             | event            | what happens                                        | next
    ------------------+------------------+-----------------------------------------------------+---------
    NEW               | Started          | OpenLease                                           | OPENING
    NEW, OPENING      | DrainRequested   | nothing held yet (an OpenLease in flight: see *)    | STOPPED*
    OPENING           | LeaseOpened      | first poll: ClaimJobs                               | RUNNING
    OPENING           | Tick             | retry OpenLease after a failed one                  | OPENING
    OPENING           | StoreFailed      | OpenLease failed: retry after poll_interval         | OPENING
    OPENING           | OutcomesWritten  | none is in flight here: refused, unless stale (see  | OPENING
                      |                  | below)                                              |
    RUNNING           | Tick             | poll due: ClaimJobs(free) then WriteOutcomes; else  | RUNNING
                      |                  | outcomes lingered outcome_linger (and past a fault  |
                      |                  | backoff): WriteOutcomes + ClaimJobs;                |
                      |                  | heartbeat due: RenewLease; maintenance due:         |
                      |                  | ExpireLeases, MintSchedules, RollUpStats,           |
                      |                  | AnalyzeTables, PurgeJobs, PurgePumps,               |
                      |                  | PurgeTaskStats; a full rollup page: the next        |
                      |                  | RollUpStats; a full purge page: the next PurgeJobs; |
                      |                  | an attempt past its deadline (see ** below): its    |
                      |                  | outcome buffered, StopAttempt, its slot taken until |
                      |                  | its handler returns, jobs claimed ahead: ReleaseJobs|
                      |                  | (its thread may never come back); a ForgetOverruns  |
                      |                  | that failed, past its backoff: again (******);      |
                      |                  | lease presumed lapsed: self-fence                   | OPENING
    RUNNING, DRAINING | CancelRequested  | of a job it runs: StopAttempt, the attempt ends     | same
                      |                  | cancelled when it returns, or at its deadline, now  |
                      |                  | + cancel_grace at the latest (**); of a job claimed |
                      |                  | ahead (*****): never run, CANCELLED buffered (a     |
                      |                  | flush if due, as JobFinished); else nothing         |
    RUNNING           | HintReceived     | a claim in flight: claim again once it lands, room  | RUNNING
                      |                  | permitting (one pending-poll slot: a burst costs    |
                      |                  | one extra claim); else a free slot: poll now; none: |
                      |                  | nothing                                             |
    RUNNING           | ClaimReturned    | ExecuteJob per job a thread is free for, the rest   | RUNNING
                      |                  | wait claimed ahead (*****); at the pass's end,      |
                      |                  | outcomes that came due while it was in flight (***):|
                      |                  | WriteOutcomes + ClaimJobs; else full batch and      |
                      |                  | room: ClaimJobs                                     |
    RUNNING           | JobFinished      | decide outcome (it carries the event's report),     | RUNNING
                      |                  | buffer; the next job claimed ahead: ExecuteJob;     |
                      |                  | flush when the batch is full, nothing               |
                      |                  | executes or the oldest waiting lingered             |
                      |                  | outcome_linger, or no idle pool is expected within  |
                      |                  | a round-trip (****): WriteOutcomes + ClaimJobs; a   |
                      |                  | claim in flight: the write waits for its answer     |
                      |                  | (***).                                              |
                      |                  | Committed (an atomic task wrote its own fenced      |
                      |                  | outcome): applied, the slot reopens, nothing        |
                      |                  | buffered, the next job claimed ahead: ExecuteJob;   |
                      |                  | nothing else executes: flush + claim,               |
                      |                  | or ClaimJobs alone; else ClaimJobs once the free    |
                      |                  | slots fill an outcome batch                         |
    RUNNING           | OutcomesWritten  | slots reopen; the next batch if due (as             | RUNNING
                      |                  | JobFinished, *** included); else re-poll if no      |
                      |                  | claim rode it: the                                  |
                      |                  | dependents it released (their last ancestor         |
                      |                  | succeeded in it) are claimable at once, and a claim |
                      |                  | in flight runs after the write and sees them;       |
                      |                  | released counted (stats.released); its busy         |
                      |                  | outcomes (*******) wait poll_interval, then go in   |
                      |                  | the next write                                      |
    RUNNING           | LeaseRenewed     | held: its cancels, each as a CancelRequested; lost: | RUNNING/OPENING
                      |                  | abandon all (their slots stay taken until their     |
                      |                  | handlers return; jobs claimed ahead are dropped and |
                      |                  | lapse with the lease), OpenLease                    |
    RUNNING, DRAINING | JobsReleased     | its busy jobs (********): ReleaseJobs of them again | same
                      |                  | after poll_interval, on a tick                      |
    RUNNING, DRAINING | OverrunsForgotten| handlers that returned meanwhile: ForgetOverruns    | same
    RUNNING           | StoreFailed      | undo the command's bookkeeping, retry on a tick     | RUNNING
                      |                  | after a jittered backoff that doubles per fault in  |
                      |                  | a row (up to half a heartbeat); a failed claim may  |
                      |                  | have committed: the next claim waits for a          |
                      |                  | ReconcileLease(known = (job, attempt) held), and so |
                      |                  | does it after a failed ReleaseJobs (its jobs still  |
                      |                  | run under the lease, held by no one); a failed      |
                      |                  | ForgetOverruns: its attempts wait for it            |
    RUNNING           | LeaseReconciled  | the claim that waited for it: ClaimJobs(free); its  | RUNNING
                      |                  | busy jobs (********) as JobsReleased's              |
    RUNNING           | DrainRequested   | stop claiming; jobs claimed ahead: ReleaseJobs      | DRAINING
    any*              | JobFinished      | of an abandoned attempt: no outcome; its slot       | same
                      |                  | reopens (a poll or a write's claim uses it, or the  |
                      |                  | next job claimed ahead: ExecuteJob); one ended past |
                      |                  | its deadline whose outcome went out flagged overrun |
                      |                  | (******), in RUNNING or DRAINING: ForgetOverruns;   |
                      |                  | outside RUNNING and DRAINING nothing else executes  |
    any*              | HintReceived     | outside RUNNING: nothing                            | same
    any*              | CancelRequested  | outside RUNNING and DRAINING: nothing               | same
    any*              | LeasesExpired,   | maintenance results: nothing to do; a full purge    | same
                      | SchedulesMinted, | or rollup page goes on on the next tick in RUNNING  |
                      | PumpsPurged,     | only; in RUNNING, jobs expiry released or minting   |
                      | JobsPurged,      | made ready: ClaimJobs(free) unless one is in flight |
                      | StatsRolledUp,   | (the pump does not hear its own hints)              |
                      | TablesAnalyzed,  |                                                     |
                      | TaskStatsPurged  |                                                     |
    DRAINING          | JobFinished,     | as RUNNING but no claims; when nothing executes (or | DRAINING
                      | OutcomesWritten, | the deadline passes): WriteOutcomes, then           |
                      | Tick             | ReleaseLease (gives back what did not finish); a    |
                      |                  | Tick ends attempts past their deadline as RUNNING's;|
                      |                  | busy outcomes are retried until the deadline        |
    DRAINING          | ClaimReturned    | ReleaseJobs of what it claimed                      | DRAINING
    DRAINING          | LeaseRenewed     | held: its cancels, as in RUNNING; lost: give up     | STOPPED
    DRAINING          | LeaseReconciled  | nothing to claim; its busy jobs as JobsReleased's   | DRAINING
    DRAINING          | LeaseReleased    | the abandoned handlers keep their slots             | STOPPED
    DRAINING          | StoreFailed      | on the release, or past the deadline: give up, the  | STOPPED
                      |                  | lease lapses and maintenance frees the rest         |
    DRAINING, STOPPED | DrainRequested   | nothing                                             | same
    STOPPED           | LeaseOpened      | one that was in flight at the drain: ReleaseLease   | DRAINING
    STOPPED           | Tick             | nothing                                             | STOPPED
    STOPPED           | StoreFailed      | of the OpenLease in flight at the drain: nothing    | STOPPED

    * after a LeaseOpened that was already in flight, the lease is released first.
    ** attempt deadlines: an attempt of a job with a time limit is due to end at the ClaimReturned's
       now + its timeout; a cancel brings that forward to now + cancel_grace. Past it, on a Tick,
       the driver decides the attempt's outcome without its handler: a timeout is a failed attempt
       (RETRY or FAILED under the job's rules), an ignored cancel is CANCELLED. The JobFinished
       that comes when the handler returns is then an abandoned attempt's. A claimed job whose
       cancel was requested while an earlier attempt ran is CANCELLED at once, never executed.
    *** a write that comes due (a JobFinished, a landed write, a lingered Tick) while a claim is
       in flight waits for that claim's answer, which comes next on the pump's one connection:
       sent at once it would go alone, and the claim for the slots it frees would follow on a
       round-trip of its own. At the end of the pass the ClaimReturned sends it, the next claim
       riding it; a failed claim leaves it to the retry's poll Tick (or its linger).
    **** the linger lets jobs that finish together share a write (the idle pool's flush). The
       driver learns each task's attempt duration (ClaimReturned to JobFinished) and a write's
       round-trip; while an executing job is expected to run on past a round-trip from now,
       waiting for an idle pool would only keep finished jobs' slots empty, so their outcomes
       go at once (those arriving meanwhile wait for that write, one in flight at most). A task
       not measured yet is expected to end at once, so the linger applies as before.
    ***** claim-ahead: while the pool's work is known to be short (every task seen finishing took
       under CLAIM_AHEAD_HORIZON on average, and every executing job is of a task seen finishing),
       a pump holds up to jobs_ahead claimed jobs beyond its threads, in claim order. A thread
       that finishes takes the next at once, so the pool runs on while the write and the next
       claim are in flight (the production pump feeds the driver the jobs that finish during
       its write or claim: see the executor's ``aside``). They are claimed, not executing: no deadline until they start, a
       cancel ends them unstarted, a drain or an attempt ended past its deadline gives them back,
       a lost lease drops them.
    ****** overruns (core/overruns.py): a handler whose attempt ended past its deadline still
       counts against its queue's and key's limits, cluster-wide, until it returns. Its outcome
       goes out flagged overrun while it runs (the write leaves an overrun row under the
       lease); once it returns, ForgetOverruns deletes the row (one in flight at most; a failed
       one is sent again on a tick past its fault backoff). One that returned while its outcome
       still waited leaves no row. A lost lease, a self-fence or a drain's end drops them all:
       the rows count only under a live lease, and go with it.
    ******* busy: an outcome the store could not write because another transaction (an
       application's: an enqueue after= it, a cancel, a select_for_update()) holds its job's row
       comes back busy in OutcomesWritten, neither applied nor lost. The rest of its batch landed;
       it waits in the buffer, still holding its slot, and goes in the first write after
       poll_interval (a Tick then sends it when nothing else does). Draining, a busy outcome still
       held at the deadline is given up with the lease (ReleaseLease).
    ******** busy releases: jobs a ReleaseJobs or a ReconcileLease passed over because another
       transaction held their rows come back busy in its answer. They still run under the live
       lease, held by no one and never executed (the heartbeat keeps that lease), so the driver
       sends ReleaseJobs of them again on the first tick past poll_interval, until an answer
       has none busy. No claim waits for them (the driver knows which jobs they are); a lost
       lease, a self-fence or a drain's end forgets them: they go with the lease.
    any*: every state but NEW.

Stale results: a lost lease, a self-fence or a drain's end leaves the results of commands sent
under the old lease on their way. Each (or its StoreFailed) is swallowed on arrival, in any state
and before the table above is consulted, while no command of its kind is in flight::

    result           | answers
    -----------------+---------------
    ClaimReturned    | ClaimJobs
    OutcomesWritten  | WriteOutcomes
    LeaseRenewed     | RenewLease
    LeaseReconciled  | ReconcileLease
    LeaseReleased    | ReleaseLease
    OverrunsForgotten| ForgetOverruns

Self-fencing, the Tick row's "lease presumed lapsed": see core/lease.py.

Any other pairing raises ``InvalidEvent`` naming the event and the state, and leaves the driver
untouched: the shell halts the pump on it (fail-stop).
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
_MAINTENANCE_RESULTS = frozenset(
    {ev.LeasesExpired, ev.SchedulesMinted, ev.PumpsPurged, ev.JobsPurged, ev.StatsRolledUp, ev.TablesAnalyzed, ev.TaskStatsPurged}
)
# What every state but NEW takes: timers, hints, cancels, handlers returning, faults, maintenance, a drain.
_LIVE = (
    frozenset({ev.Tick, ev.HintReceived, ev.CancelRequested, ev.JobFinished, ev.StoreFailed, ev.DrainRequested})
    | _MAINTENANCE_RESULTS
)
# Answers to commands sent under a held lease.
_UNDER_LEASE = frozenset(
    {ev.ClaimReturned, ev.OutcomesWritten, ev.LeaseRenewed, ev.JobsReleased, ev.LeaseReconciled, ev.OverrunsForgotten}
)

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
    ev.StatsRolledUp: cmd.RollUpStats,
    ev.PumpsPurged: cmd.PurgePumps,
    ev.TaskStatsPurged: cmd.PurgeTaskStats,
    ev.TablesAnalyzed: cmd.AnalyzeTables,
    ev.JobsReleased: cmd.ReleaseJobs,
    ev.LeaseReconciled: cmd.ReconcileLease,
    ev.LeaseReleased: cmd.ReleaseLease,
    ev.OverrunsForgotten: cmd.ForgetOverruns,
}
STORE_RESULTS = frozenset(ANSWERS)

# Commands whose result may still arrive after the driver gave their lease up (a lost lease, a
# self-fence, a drain's end). Such a stale result, or its StoreFailed, is swallowed on arrival
# in any state, before ACCEPTS is consulted, while no command of its kind is in flight: the
# store's fence makes whatever it did a no-op.
STALE_TOLERANT = frozenset(
    {cmd.ClaimJobs, cmd.WriteOutcomes, cmd.RenewLease, cmd.ReconcileLease, cmd.ReleaseLease, cmd.ForgetOverruns}
)

# Store commands the driver waits for none of: a StoreFailed of one is always accepted, and the
# next maintenance run (or the lease's lapse) makes up for it.
UNTRACKED = frozenset(
    {cmd.ExpireLeases, cmd.MintSchedules, cmd.PurgePumps, cmd.PurgeTaskStats, cmd.AnalyzeTables, cmd.ReleaseJobs}
)

# The results of the commands the driver waits for: each is refused while none of its kind is in flight.
AWAITED: dict[type[ev.Event], type[cmd.Command]] = {result: sent for result, sent in ANSWERS.items() if sent not in UNTRACKED}


def answered_by(event: ev.Event) -> type | None:
    """The command type whose outcome ``event`` reports, if it reports one."""
    if isinstance(event, ev.StoreFailed):
        return type(event.command)
    return ANSWERS.get(type(event))


def accepting(event_type: type[ev.Event]) -> tuple[State, ...]:
    """The states that accept ``event_type``, in lifecycle order."""
    return tuple(state for state in State if event_type in ACCEPTS[state])

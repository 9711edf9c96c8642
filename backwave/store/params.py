"""What every store sends: the statements' parameters, encoded and checked in one place.

PostgresStore passes these to its SQL; the in-memory store (backwave/testing/memory_store.py)
decodes the very same parameters and mirrors the SQL on them, and the test pump's store runs
PostgresStore's methods on Django's connection. One encoder for all of them is what makes "a
value PostgreSQL would refuse is refused by every store, with the same error, before anything
changes" true by construction rather than by care.

The outcome batch is the store's wall against what a task hands back (see ``storable``): a row
that cannot be encoded is replaced before anything is sent (``outcome_batch``), and a row the
server refuses is isolated by bisection and replaced (``write_isolating``). Pure Python: no
psycopg, no Django.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from backwave.core.jobs import ClaimedJob, OutcomeKind

from .contract import (
    NOTHING_OBSERVED,
    Applied,
    DeliveryResult,
    DependencyRefused,
    Heartbeat,
    Inserted,
    NewJob,
    OutcomeRecord,
    ProgressReport,
    Store,
    StoreError,
    TransientStoreError,
    TransitionRecord,
)
from .storable import UNSTORABLE_RESULT, ascii_text, clean_text, error_class_text, result_problem

# -- leases and claims ---------------------------------------------------------------------------


def lease_seconds(duration: float) -> float:
    """A lease duration as the statements take it: a positive number of seconds."""
    if not duration > 0:
        raise ValueError(f"a lease duration must be a positive number of seconds, got {duration!r}")
    return float(duration)


def claim_statement(
    *, lease_id: uuid.UUID, worker_id: str, queues: Sequence[str], limit: int, admitted: frozenset[str] = frozenset()
) -> tuple[str, dict[str, Any]] | None:
    """The claim query's name and parameters, or None when nothing can be claimed. A claim that
    includes a queue of ``admitted`` (under a per-key or rate limit) is claim_jobs_admitted."""
    if isinstance(queues, str):
        raise TypeError(f"queues must be a sequence of queue names, not the string {queues!r}; pass [{queues!r}]")
    unique = list(dict.fromkeys(queues))  # a queue listed twice would see its own locked rows again
    if limit <= 0 or not unique:
        return None
    params: dict[str, Any] = {"lease_id": lease_id, "worker_id": worker_id, "limit": limit}
    if admitted and not admitted.isdisjoint(unique):
        return "claim_jobs_admitted", {**params, "queues": unique}
    if len(unique) == 1:
        return "claim_jobs_one_queue", {**params, "queue": unique[0]}
    return "claim_jobs_many_queues", {**params, "queues": unique}


def known_params(known: Sequence[tuple[int, int]]) -> dict[str, list[int]]:
    """reconcile_lease's (job id, attempt) pairs as the two arrays its unnest() zips back."""
    for pair in known:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)):
            raise TypeError(f"reconcile_lease's known holds (job id, attempt) pairs of integers, got {pair!r}")
    pairs = list(known)
    return {"known_ids": [job_id for job_id, _ in pairs], "known_attempts": [attempt for _, attempt in pairs]}


def heartbeat_params(lease_id: uuid.UUID, duration: float, progress: Sequence[ProgressReport]) -> dict[str, Any]:
    """The parameters of the heartbeat: the reports as one JSON array. A report that cannot be
    encoded (it slipped past the attempt's own check) is dropped here: progress is never worth
    the lease."""
    rows = []
    for report in progress:
        row = {"job_id": report.job_id, "attempt": report.attempt, "progress": report.progress, "metadata": report.metadata}
        try:
            encoded = json.dumps(row, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            continue
        if not _JSON_NUL.search(encoded):
            rows.append(row)
    return {"lease_id": lease_id, "duration": lease_seconds(duration), "progress": json.dumps(rows)}


def heartbeat_from_row(row: tuple) -> Heartbeat:
    held, cancels, _reported, busy = row
    return Heartbeat(
        held=bool(held), cancels={int(job_id): by for job_id, by in (cancels or {}).items()}, busy=frozenset(busy or ())
    )


def is_refused_heartbeat(error: StoreError) -> bool:
    """Whether the heartbeat was refused for the reports it carried (SQLSTATE class 22)."""
    return bool(error.sqlstate) and error.sqlstate.startswith("22") and error.statement == "heartbeat"


# -- enqueue ---------------------------------------------------------------------------------------


def insert_statement(jobs: Sequence[NewJob], *, hint: bool, observed: str = NOTHING_OBSERVED) -> tuple[str, dict[str, Any]]:
    """The enqueue's statement and parameters: enqueue_many, or enqueue_with_dependencies when
    a job of the batch waits for others (the plain batch keeps the plain statement; ``observed``:
    the transitions observers watch, for a dependent cancelled at the commit)."""
    if not any(job.after for job in jobs):
        return enqueue_statement(jobs), insert_jobs_params(jobs, hint=hint)
    if any(job.unique_key is not None for job in jobs):
        raise ValueError("a batch with dependencies (after=) cannot hold a unique job: enqueue the unique job on its own")
    rows = _job_rows(jobs)
    for row, job in zip(rows, jobs, strict=True):
        row["after"] = [
            {
                "job": edge.job_id,
                "pos": None if edge.position is None else edge.position + 1,  # WITH ORDINALITY counts from 1
                "on_failure": edge.on_failure,
            }
            for edge in job.after
        ]
    return "enqueue_with_dependencies", {"jobs": json.dumps(rows), "hint": hint, "observed": observed}


# How many statements a unique enqueue sends at most: each one after the first is for keys that
# changed hands while the one before ran (see enqueue_unique_many's "retry"), which takes another
# transaction committing on that very key each time.
MAX_UNIQUE_ROUNDS = 16


def run_enqueue(
    execute: Callable[[str, dict[str, Any]], list[tuple]], jobs: Sequence[NewJob], *, hint: bool, observed: str = NOTHING_OBSERVED
) -> tuple[str, list[tuple]]:
    """Run the enqueue statement for ``jobs`` through ``execute(name, params) -> rows``: one
    statement, and for a unique batch one more for each round of keys the last one could not
    settle (their rows replace the unsettled ones). The statement's name and rows, in input order."""
    name, params = insert_statement(jobs, hint=hint, observed=observed)
    rows = execute(name, params)
    if name != "enqueue_unique_many":
        return name, rows
    rows = list(rows)
    for _ in range(MAX_UNIQUE_ROUNDS - 1):
        pending = [position for position, row in enumerate(rows) if row[8]]
        if not pending:
            return name, rows
        for position, row in zip(pending, execute(name, insert_jobs_params([jobs[p] for p in pending], hint=hint)), strict=True):
            rows[position] = row
    if any(row[8] for row in rows):
        raise TransientStoreError(
            f"enqueue_unique_many: the keys of {sum(1 for row in rows if row[8])} job(s) changed hands in each of "
            f"{MAX_UNIQUE_ROUNDS} statements in a row; nothing more was sent for them (retry the enqueue)",
            statement="enqueue_unique_many",
        )
    return name, rows


def inserted_ids(name: str, rows: list[tuple]) -> list[int]:
    """The ids an enqueue statement returned, or DependencyRefused naming the ancestors it refused."""
    if name != "enqueue_with_dependencies":
        return [row[0] for row in rows]
    refused = {row[1]: row[2] for row in rows if row[0] is None}
    if refused:
        raise DependencyRefused(dependency_refusal(refused), refused)
    return [row[0] for row in rows]


def dependency_refusal(refused: Mapping[int, str | None]) -> str:
    """The message of DependencyRefused."""
    parts = []
    for job_id, state in sorted(refused.items()):
        if state is None:
            parts.append(f"job {job_id} does not exist (a wrong id, another database, or purged by retention)")
        else:
            parts.append(
                f"job {job_id} is already {state}, so a dependent with on_failure 'cancel' or 'hold' would be "
                "cancelled or held at once; retry it first, or depend on it with on_failure='run'"
            )
    return "Nothing was enqueued: " + "; ".join(parts) + "."


def insert_jobs_params(jobs: Sequence[NewJob], *, hint: bool) -> dict[str, Any]:
    """The parameters of enqueue_many: the jobs as one JSON array of objects, and whether the
    statement sends a Wake-Up Hint per queue."""
    return {"jobs": json.dumps(_job_rows(jobs)), "hint": hint}


def _job_rows(jobs: Sequence[NewJob]) -> list[dict[str, Any]]:
    return [
        {
            "task_path": job.task_path,
            "payload": job.payload,
            "queue": job.queue,
            "priority": job.priority,
            "run_at": job.run_at.isoformat() if job.run_at is not None else None,
            "max_attempts": job.max_attempts,
            "backoff_base": float(job.backoff_base),
            "backoff_max": float(job.backoff_max),
            "backend": job.backend,
            "tags": list(job.tags),
            "timeout": None if job.timeout is None else float(job.timeout),
            "trace_context": dict(job.trace_context) if job.trace_context else None,
            # Only when set: jsonb_to_recordset reads a missing key as NULL, and plain batches
            # stay as short as they were.
            **({"limit_key": job.limit_key} if job.limit_key is not None else {}),
            **(
                {
                    "unique_key": job.unique_key,
                    "unique_period": None if job.unique_period is None else float(job.unique_period),
                    "unique_states": list(job.unique_states),
                    "unique_replace": list(job.unique_replace),
                }
                if job.unique_key is not None
                else {}
            ),
        }
        for job in jobs
    ]


# -- transition observers -------------------------------------------------------------------------


def transition_record(row: tuple) -> TransitionRecord:
    """A row of claim_transitions."""
    transition_id, job_id, attempt, kind, task_path, queue, occurred_at, deliveries, delivered_to, observers = row
    return TransitionRecord(
        id=transition_id,
        job_id=job_id,
        attempt=attempt,
        kind=kind,
        task_path=task_path,
        queue=queue,
        occurred_at=occurred_at,
        deliveries=deliveries,
        delivered_to=tuple(delivered_to or ()),
        observers=tuple(observers or ()),
    )


def delivery_params(token: uuid.UUID, results: Sequence[DeliveryResult]) -> dict[str, Any]:
    """settle_transitions' parameters: the pass's results as one JSON array, texts cleaned."""
    rows = [
        {
            "id": r.id,
            "delivered": list(r.delivered),
            "failed_observer": None if r.failed_observer is None else clean_text(r.failed_observer)[:255],
            "error": clean_text(r.error),
            "retry_delay": float(r.retry_delay),
            "dead": bool(r.dead),
        }
        for r in results
    ]
    return {"token": token, "results": json.dumps(rows)}


def enqueue_statement(jobs: Sequence[NewJob]) -> str:
    """enqueue_unique_many when a job of the batch declares uniqueness, else enqueue_many."""
    return "enqueue_unique_many" if any(job.unique_key is not None for job in jobs) else "enqueue_many"


def insert_statement_name(jobs: Sequence[NewJob]) -> str:
    """The name of insert_statement's statement for ``jobs``."""
    return "enqueue_with_dependencies" if any(job.after for job in jobs) else enqueue_statement(jobs)


def inserted_from_rows(name: str, rows: list[tuple]) -> list[Inserted]:
    """The answer of an enqueue statement, per job in input order (DependencyRefused naming the
    ancestors enqueue_with_dependencies refused)."""
    if name == "enqueue_many":
        return [Inserted(row[0], enqueued_at=row[1]) for row in rows]
    if name == "enqueue_with_dependencies":
        inserted_ids(name, rows)  # DependencyRefused when an ancestor was refused
        return [Inserted(row[0], state=row[4], enqueued_at=row[5]) for row in rows]
    return [
        Inserted(
            id=row[0],
            duplicate=row[1],
            state=row[2],
            payload=row[3],
            enqueued_at=row[4],
            started_at=row[5],
            last_attempted_at=row[6],
            finished_at=row[7],
            reason=row[9],
        )
        for row in rows
    ]


# -- outcomes: the batch, and what cannot be encoded -------------------------------------------


def outcome_params(lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> dict[str, Any]:
    """The parameters of write_outcomes_many (see outcome_batch)."""
    return outcome_batch(lease_id, outcomes)[0]


def outcome_batch(lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> tuple[dict[str, Any], dict[int, OutcomeRecord]]:
    """The parameters of write_outcomes_many (the batch as one JSON array), and the records put
    in place of those that could not be encoded, by job id.

    A SUCCEEDED outcome's return value travels boxed as ``{"v": value}``, so a task that returned
    None stores JSON ``null`` (a value); every other kind stores SQL NULL (no value at all).
    A record whose row cannot be encoded (a return value that is not JSON, NaN, an int too long
    for text) or that carries a NUL escape jsonb refuses is replaced here, before anything is
    sent, by the failed attempt that says why (``unstorable_replacement``): one bad value would
    otherwise fail the whole batch.
    """
    if len({o.job_id for o in outcomes}) != len(outcomes):
        seen: set[int] = set()
        duplicate = next(o.job_id for o in outcomes if o.job_id in seen or seen.add(o.job_id))
        raise ValueError(f"job {duplicate} has two outcomes in one batch; a batch holds one outcome per job")
    rows = [_outcome_row(o) for o in outcomes]
    replaced: dict[int, OutcomeRecord] = {}
    # One encode for the whole batch on the hot path; only when it fails, or when a NUL escape
    # shows up, is each row encoded alone, to find the ones at fault.
    try:
        encoded = json.dumps(rows, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        encoded = None
    if encoded is None or has_json_nul(encoded):
        rows = []
        for outcome in outcomes:
            problem = _row_problem(outcome)
            if problem is not None:
                outcome = replaced[outcome.job_id] = _encodable(unstorable_replacement(outcome, problem))
            rows.append(_outcome_row(outcome))
        encoded = json.dumps(rows, allow_nan=False)
    return {"lease_id": lease_id, "outcomes": encoded, "observed": NOTHING_OBSERVED}, replaced


def _outcome_row(o: OutcomeRecord) -> dict[str, Any]:
    row = {
        "job_id": o.job_id,
        "attempt": o.attempt,
        "kind": o.kind.value,
        "retry_delay": float(o.retry_delay or 0.0),
        "boxed": {"v": o.return_value} if o.kind is OutcomeKind.SUCCEEDED else None,
        "error_class": error_class_text(o.error_class),
        "traceback": clean_text(o.traceback),
        "duration": float(o.duration),
    }
    # The side channels only when the attempt used them: a key left out reads as NULL in
    # jsonb_to_recordset, and most jobs report none of them (less to encode, send and parse).
    if o.progress is not None:
        row["progress"] = o.progress
    if o.metadata is not None:
        row["metadata"] = o.metadata
    if o.output:
        row["output"] = o.output
    if o.tags_added:
        row["tag_add"] = list(o.tags_added)
    if o.tags_removed:
        row["tag_remove"] = list(o.tags_removed)
    if o.overrun:
        row["overrun"] = True
    return row


def _row_problem(outcome: OutcomeRecord) -> str | None:
    """Why this outcome's row cannot be encoded for jsonb, or None."""
    if outcome.output:
        try:
            json.dumps(outcome.output, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as error:
            problem = result_problem(outcome.output) or str(error)
        else:
            problem = result_problem(outcome.output)
        if problem is not None:
            return f"its output cannot be stored: {problem.replace('the return value', 'the output', 1)}"
    try:
        encoded = json.dumps(_outcome_row(outcome), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        if outcome.kind is OutcomeKind.SUCCEEDED:
            return f"its return value cannot be stored: {result_problem(outcome.return_value) or error}"
        return f"its outcome cannot be encoded as JSON: {error}"
    if has_json_nul(encoded):
        return f"its return value cannot be stored: {result_problem(outcome.return_value) or 'it holds a NUL character'}"
    return None


def _encodable(replacement: OutcomeRecord) -> OutcomeRecord:
    """The replacement, or when even it cannot be encoded (its retry delay is NaN), the last one."""
    if _row_problem(replacement) is None:
        return replacement
    return unstorable_replacement(replacement, "its retry delay or duration is not a finite number", keep_decision=False)


# A \u0000 escape in JSON text, not preceded by an escaped backslash of the string's own.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def has_json_nul(encoded: str) -> bool:
    """Whether JSON text holds a NUL escape (which jsonb refuses). The plain substring test
    first: it is one C scan, where the regex alone cost ~80 us per batch, on every batch."""
    return "\\u0000" in encoded and _JSON_NUL.search(encoded) is not None


def applied_from_rows(rows: list[tuple], replaced: Mapping[int, OutcomeRecord]) -> Applied:
    """The ids a write's RETURNING gave back (job id, released, busy), with the replacements
    among them; the busy ones apart."""
    ids = {row[0] for row in rows if not (len(row) > 2 and row[2])}
    busy = {row[0] for row in rows if len(row) > 2 and row[2]}
    released = next((row[1] for row in rows if row[0] in ids), 0) if len(rows[0] if rows else ()) > 1 else 0
    return Applied(ids, {job_id: record for job_id, record in replaced.items() if job_id in ids}, released=released, busy=busy)


def lock_params(lease_id: uuid.UUID, outcomes: Sequence[OutcomeRecord]) -> dict[str, Any]:
    """lock_outcome_jobs' parameters: the jobs, as an array literal."""
    return {"lease_id": lease_id, "job_ids": "{" + ",".join(str(o.job_id) for o in outcomes) + "}"}


# -- the second wall: a batch the server refuses for one row's data ----------------------------


def write_then_claim(
    store: Store,
    *,
    lease_id: uuid.UUID,
    worker_id: str,
    outcomes: Sequence[OutcomeRecord],
    queues: Sequence[str],
    limit: int,
    together: Callable[[tuple[str, dict[str, Any]]], tuple[Applied, list[ClaimedJob]]],
    write: Callable[[Sequence[OutcomeRecord]], Applied],
) -> tuple[Applied, list[ClaimedJob]]:
    """Every store's write_outcomes_then_claim around its one combined operation
    ``together(claim statement)``: without outcomes it is a claim, with nothing to claim a write.
    When the server refuses the batch for a row's data the claim never ran: the outcomes go as
    write_outcomes_many isolates a refused row (``write``: one statement), then the claim,
    which still sees every outcome written."""
    claim = claim_statement(
        lease_id=lease_id,
        worker_id=worker_id,
        queues=queues,
        limit=limit,
        admitted=getattr(store, "admitted_queues", frozenset()),
    )
    if not outcomes:
        return Applied(), store.claim_jobs(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit)
    if claim is None:
        return store.write_outcomes_many(lease_id=lease_id, outcomes=outcomes), []
    try:
        return together(claim)
    except StoreError as error:
        if not is_refused_data(error):
            raise
        applied = write_isolating(write, outcomes, refused=error)
        return applied, store.claim_jobs(lease_id=lease_id, worker_id=worker_id, queues=queues, limit=limit)


def is_refused_data(error: StoreError) -> bool:
    """Whether the outcome write was refused for the data it carried (SQLSTATE class 22: a
    jsonb escape, a number or a timestamp out of range, a character the encoding lacks)."""
    return (
        bool(error.sqlstate)
        and error.sqlstate.startswith("22")
        and error.statement in ("write_outcomes_many", "write_outcomes_plain")
    )


def write_isolating(
    write: Callable[[Sequence[OutcomeRecord]], Applied], outcomes: Sequence[OutcomeRecord], *, refused: StoreError | None = None
) -> Applied:
    """``write(outcomes)`` (one statement), and when the server refuses it for a row's data, the
    same write bisected until each refused row stands alone; that row is then written as its
    replacement (``unstorable_replacement``). ``refused``: the batch was already refused once.

    Bisection because the server names no row: one refused row among n costs about 2·log2(n)
    statements more, and only ever when the attempt's own checks missed something. Shared by
    every store, so they isolate, and count round-trips, alike.
    """
    if refused is None:
        try:
            return write(outcomes)
        except StoreError as error:
            if not is_refused_data(error):
                raise
            refused = error
    if len(outcomes) == 1:
        return _write_replacement(write, outcomes[0], refused)
    middle = len(outcomes) // 2
    first, second = write_isolating(write, outcomes[:middle]), write_isolating(write, outcomes[middle:])
    return first.joined(second)


def _write_replacement(
    write: Callable[[Sequence[OutcomeRecord]], Applied], outcome: OutcomeRecord, refused: StoreError
) -> Applied:
    reason = f"PostgreSQL refused it [{refused.sqlstate}]: {_server_reason(refused)}"
    replacement = unstorable_replacement(outcome, reason)
    for keep_decision in (True, False):
        if not keep_decision:
            replacement = unstorable_replacement(outcome, reason, keep_decision=False)
        try:
            applied = write([replacement])
        except StoreError as again:
            if not is_refused_data(again) or not keep_decision:
                raise
            reason += f"; written as it was decided ({outcome.kind.value}), it was refused again [{again.sqlstate}]: {_server_reason(again)}"
            continue
        return Applied(
            applied,
            {outcome.job_id: replacement} if outcome.job_id in applied else {},
            released=applied.released,
            busy=applied.busy,
        )
    raise AssertionError("unreachable: the last replacement is written or raises")


def unstorable_replacement(outcome: OutcomeRecord, reason: str, *, keep_decision: bool = True) -> OutcomeRecord:
    """The failed attempt written in place of an outcome whose data cannot be stored.

    A SUCCEEDED outcome cannot stand (its value is what could not be stored): it becomes FAILED,
    not a retry, since the task already ran to the end and would return the same value again.
    RETRY, FAILED and QUARANTINED keep their kind and delay, with their own error text, escaped
    to plain ASCII, below the reason; ``keep_decision=False`` (that was refused too) fails the
    job with the reason alone. The error class is always backwave.UnstorableResult.
    """
    if outcome.kind is OutcomeKind.SUCCEEDED or not keep_decision:
        what = (
            "the task returned, but"
            if outcome.kind is OutcomeKind.SUCCEEDED
            else f"the attempt ended ({outcome.kind.value}), but"
        )
        text = f"{UNSTORABLE_RESULT}: {what} {ascii_text(reason)}. The job is failed without another attempt; retry it from the admin once that is fixed.\n"
        return OutcomeRecord(
            job_id=outcome.job_id,
            attempt=outcome.attempt,
            kind=OutcomeKind.FAILED,
            error_class=UNSTORABLE_RESULT,
            traceback=text,
            overrun=outcome.overrun,
        )
    own = "\n".join(part for part in (ascii_text(outcome.error_class), ascii_text(outcome.traceback)) if part)
    text = f"{UNSTORABLE_RESULT}: this attempt's outcome could not be stored as it was: {ascii_text(reason)}.\n\nIts own error, escaped:\n{own}\n"
    return OutcomeRecord(
        job_id=outcome.job_id,
        attempt=outcome.attempt,
        kind=outcome.kind,
        retry_delay=outcome.retry_delay,
        error_class=UNSTORABLE_RESULT,
        traceback=text,
        duration=outcome.duration,
        overrun=outcome.overrun,
    )


def _server_reason(error: StoreError) -> str:
    """The server's message and detail (the context line quotes the refused data: left out)."""
    message = str(error).split("]: ", 1)[-1]
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith(("CONTEXT:", "unnamed portal", "LINE ", "^", "HINT:"))]
    return " ".join(kept) or "(no message)"

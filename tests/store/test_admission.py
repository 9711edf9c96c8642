"""Admission in every store: per-key concurrency, rate limits and unique enqueues."""

from __future__ import annotations

from datetime import timedelta

from backwave.store.contract import NewJob


QUEUE = "default"


def _jobs(store, keys, *, queue=QUEUE):
    return store.enqueue_many(
        [
            NewJob(task_path="tests.t", payload={"args": [i], "kwargs": {}}, queue=queue, limit_key=key)
            for i, key in enumerate(keys)
        ]
    )


def _keys(rows, claimed):
    jobs = rows.jobs()
    return sorted(str(jobs[job.id].limit_key) for job in claimed)


def test_a_per_key_limit_caps_each_key_and_leaves_the_others(make_store, rows, lease):
    rows.set_admission(QUEUE, key_concurrency_limit=2)
    store = make_store(admitted_queues=[QUEUE])
    _jobs(store, ["a", "a", "a", "b", "b", "b", None])
    claimed = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert _keys(rows, claimed) == ["None", "a", "a", "b", "b"]
    assert store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10) == []
    rows.set_state(next(job.id for job in claimed if rows.job(job.id).limit_key == "a"), "succeeded")
    again = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert _keys(rows, again) == ["a"]


def test_a_saturated_keys_backlog_does_not_stall_the_queue(make_store, rows, lease):
    rows.set_admission(QUEUE, key_concurrency_limit=1)
    store = make_store(admitted_queues=[QUEUE])
    _jobs(store, ["busy"] * 200 + ["other-1", "other-2"])
    first = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=1)
    assert _keys(rows, first) == ["busy"]
    # 199 jobs of the saturated key come first in claim order; the claim passes over them.
    behind = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=5)
    assert _keys(rows, behind) == ["other-1", "other-2"]


def test_a_plain_claim_leaves_an_admission_limited_queue_alone(make_store, rows, lease):
    rows.set_admission(QUEUE, key_concurrency_limit=1)
    unaware = make_store(admitted_queues=[])
    _jobs(unaware, ["a", "b"])
    assert unaware.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10) == []
    assert unaware.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE, "emails"], limit=10) == []


def test_a_rate_limit_caps_starts_per_window_and_refills_in_the_next(make_store, rows, lease):
    rows.set_admission(QUEUE, rate_limit=5, rate_period=3600)
    store = make_store(admitted_queues=[QUEUE])
    _jobs(store, [None] * 12)
    assert len(store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=3)) == 3
    assert len(store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)) == 2
    assert store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10) == []
    assert rows.rate_window(QUEUE)[1] == 5
    rows.age_rate_window(QUEUE)
    assert len(store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)) == 5
    assert rows.rate_window(QUEUE)[1] == 5


def test_admitted_and_plain_queues_claim_together_in_queue_order(make_store, rows, lease):
    rows.set_admission("emails", rate_limit=1, rate_period=3600)
    store = make_store(admitted_queues=["emails"])
    _jobs(store, [None] * 3, queue="emails")
    _jobs(store, [None] * 3, queue=QUEUE)
    claimed = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=["emails", QUEUE], limit=4)
    assert sorted(job.queue for job in claimed) == ["default", "default", "default", "emails"]


def test_a_rate_limit_and_a_key_limit_hold_together(make_store, rows, lease):
    rows.set_admission(QUEUE, key_concurrency_limit=1, rate_limit=3, rate_period=3600)
    store = make_store(admitted_queues=[QUEUE])
    _jobs(store, ["a", "a", "b", "c", "d"])
    claimed = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert _keys(rows, claimed) == ["a", "b", "c"]


def test_unique_enqueues_in_a_store_make_one_job(store, rows):
    job = NewJob(task_path="tests.t", payload={"args": [1], "kwargs": {}}, unique_key="k", unique_states=("ready", "running"))
    other = NewJob(task_path="tests.t", payload={"args": [2], "kwargs": {}}, unique_key="j", unique_states=("ready",))
    first = store.enqueue_many([job, job, other])
    assert first[0] == first[1] != first[2]
    assert store.enqueue_many([job]) == [first[0]]
    assert rows.count() == 2
    assert rows.job(first[0]).unique_key == "tests.t:k"


def test_a_claimed_debounced_job_frees_its_key(store, rows, lease):
    job = NewJob(task_path="tests.t", payload={"args": [1], "kwargs": {}}, unique_key="k", unique_states=("ready",))
    (first,) = store.enqueue_many([job])
    store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=1)
    assert rows.job(first).unique_key is None
    (second,) = store.enqueue_many([job])
    assert second != first


def test_a_per_key_rate_limit_caps_each_keys_starts_per_window(make_store, rows, lease):
    rows.set_admission(QUEUE, key_rate_limit=2, rate_period=3600)
    store = make_store(admitted_queues=[QUEUE])
    _jobs(store, ["a"] * 5 + ["b"] * 3 + [None])
    first = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert _keys(rows, first) == ["None", "a", "a", "b", "b"]
    assert rows.key_rate_windows(QUEUE) == {"a": 2, "b": 2}
    for job in first:
        rows.set_state(job.id, "succeeded")  # finished, but the window's starts stay used
    assert store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10) == []
    rows.age_key_rate_windows(QUEUE)
    again = store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert _keys(rows, again) == ["a", "a", "b"]
    assert rows.key_rate_windows(QUEUE) == {"a": 2, "b": 1}


def test_past_key_windows_are_deleted_by_the_next_claim(make_store, rows, lease):
    rows.set_admission(QUEUE, key_rate_limit=1, rate_period=3600)
    store = make_store(admitted_queues=[QUEUE])
    _jobs(store, ["a", "b"])
    store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert rows.key_rate_windows(QUEUE) == {"a": 1, "b": 1}
    rows.age_key_rate_windows(QUEUE)
    _jobs(store, ["a"])
    store.claim_jobs(lease_id=lease.id, worker_id=lease.worker_id, queues=[QUEUE], limit=10)
    assert rows.key_rate_windows(QUEUE) == {"a": 1}  # b's past window is gone; a's moved on


def _debounced(number, run_at, key="k", replace=("args", "run_at")):
    return NewJob(
        task_path="tests.t",
        payload={"args": [number], "kwargs": {}},
        run_at=run_at,
        unique_key=key,
        unique_states=("ready",),
        unique_replace=replace,
    )


def _as_stored(rows, job_id):
    job = rows.job(job_id)
    return job.payload, job.run_at


def test_a_batch_debounces_as_enqueues_one_by_one_do(store, rows):
    """Calls with one key in one enqueue_many end as the same calls enqueued one after another:
    the last arguments, the latest run time (what each duplicate's replace asks for)."""
    now = rows.now()
    soon, later = now + timedelta(seconds=60), now + timedelta(seconds=120)
    calls = [(1, later), (2, soon), (3, soon)]
    one_by_one = [store.enqueue_many([_debounced(n, at, key="apart")])[0] for n, at in calls]
    batch = store.enqueue_many([_debounced(n, at, key="together") for n, at in calls])
    assert len(set(one_by_one)) == 1 and len(set(batch)) == 1
    assert _as_stored(rows, batch[0]) == _as_stored(rows, one_by_one[0]) == ({"args": [3], "kwargs": {}}, later)


def test_a_batch_of_duplicates_of_a_waiting_job_replaces_as_one_by_one(store, rows):
    now = rows.now()
    soon, later = now + timedelta(seconds=60), now + timedelta(seconds=120)
    for key in ("apart", "together"):
        store.enqueue_many([_debounced(0, soon, key=key)])
    calls = [(1, later), (2, soon, ("args",)), (3, soon, ("run_at",))]
    one_by_one = [
        store.enqueue_many([_debounced(n, at, key="apart", replace=r[0] if r else ("args", "run_at"))])[0] for n, at, *r in calls
    ]
    batch = store.enqueue_many(
        [_debounced(n, at, key="together", replace=r[0] if r else ("args", "run_at")) for n, at, *r in calls]
    )
    assert _as_stored(rows, batch[0]) == _as_stored(rows, one_by_one[0]) == ({"args": [2], "kwargs": {}}, later)

"""Unique jobs: a duplicate enqueue returns the job that holds the key, enforced by PostgreSQL."""

import itertools
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.utils import timezone

from backwave.models import Job
from backwave.tasking.task import UNIQUE_STATES, Unique, enqueue_many

from . import sample_tasks


@pytest.mark.django_db
def test_a_duplicate_returns_the_existing_job_and_says_so(django_assert_num_queries):
    first = sample_tasks.sync_order.enqueue(7, note="a")
    with django_assert_num_queries(1):
        second = sample_tasks.sync_order.enqueue(order_id=7, note="b")
    assert first.duplicate is False and second.duplicate is True
    assert second.id == first.id
    assert second.status == TaskResultStatus.READY
    assert (second.args, second.kwargs) == ([7], {"note": "a"})  # the existing job's, not replaced
    assert second.enqueued_at == Job.objects.get().enqueued_at
    assert Job.objects.count() == 1
    assert sample_tasks.sync_order.enqueue(8).duplicate is False
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_the_key_is_the_tasks_own():
    sample_tasks.sync_order.enqueue(7)
    job = Job.objects.get()
    assert job.unique_key == 'tests.backend.sample_tasks.sync_order:{"order_id":7}'
    assert job.unique_states == ["ready", "running"]
    explicit = sample_tasks.sync_order.using(unique=Unique(key="all-orders")).enqueue(9)
    assert Job.objects.get(pk=explicit.id).unique_key == "tests.backend.sample_tasks.sync_order:all-orders"


@pytest.mark.django_db
def test_a_duplicate_sends_no_enqueued_signal():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = sample_tasks.sync_order.enqueue(1)
        sample_tasks.sync_order.enqueue(1)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [first.id]


@pytest.mark.django_db
def test_in_flight_covers_running_and_frees_the_key_when_finished():
    first = sample_tasks.sync_order.enqueue(5)
    Job.objects.filter(pk=first.id).update(state="running", lease_id="00000000-0000-0000-0000-000000000001")
    again = sample_tasks.sync_order.enqueue(5)
    assert again.duplicate and again.id == first.id and again.status == TaskResultStatus.RUNNING
    Job.objects.filter(pk=first.id).update(state="succeeded", lease_id=None)
    # The trigger cleared the key for good when the job left the covered states.
    assert Job.objects.get(pk=first.id).unique_key is None
    fresh = sample_tasks.sync_order.enqueue(5)
    assert not fresh.duplicate and fresh.id != first.id


@pytest.mark.django_db
def test_a_job_that_comes_back_to_ready_never_collides_with_a_newer_one():
    # Debounce covers ready only: once the first job starts, its key is gone; a retry of it
    # (running -> ready) must not clash with the newer job that took the key meanwhile.
    first = sample_tasks.reindex.enqueue(3)
    Job.objects.filter(pk=first.id).update(state="running", lease_id="00000000-0000-0000-0000-000000000001")
    newer = sample_tasks.reindex.enqueue(3)
    assert not newer.duplicate
    Job.objects.filter(pk=first.id).update(state="ready", lease_id=None)  # a retry: no unique violation
    assert Job.objects.get(pk=first.id).unique_key is None
    assert Job.objects.get(pk=newer.id).unique_key is not None


@pytest.mark.django_db
def test_debounce_replaces_the_arguments_and_pushes_the_run_time():
    soon = timezone.now() + timedelta(seconds=5)
    later = soon + timedelta(seconds=5)
    first = sample_tasks.reindex.using(run_after=soon).enqueue(3, text="v1")
    second = sample_tasks.reindex.using(run_after=later).enqueue(3, text="v2")
    assert second.duplicate and second.id == first.id
    assert second.kwargs == {"text": "v2"}
    job = Job.objects.get()
    assert job.payload == {"args": [3], "kwargs": {"text": "v2"}}
    assert job.run_at == later
    # Pushing never pulls a run time earlier.
    sample_tasks.reindex.using(run_after=soon).enqueue(3, text="v3")
    assert Job.objects.get().run_at == later


@pytest.mark.django_db
def test_enqueue_many_debounces_as_separate_enqueues_do():
    soon = timezone.now() + timedelta(seconds=5)
    later = soon + timedelta(seconds=5)
    sample_tasks.reindex.using(run_after=later).enqueue(1, text="v1")
    sample_tasks.reindex.using(run_after=soon).enqueue(1, text="v2")
    first, second = enqueue_many(
        [
            (sample_tasks.reindex.using(run_after=later), [2], {"text": "v1"}),
            (sample_tasks.reindex.using(run_after=soon), [2], {"text": "v2"}),
        ]
    )
    assert second.duplicate and second.id == first.id and second.kwargs == {"text": "v2"}
    apart, together = Job.objects.get(payload__args=[1]), Job.objects.get(payload__args=[2])
    assert (together.payload["kwargs"], together.run_at) == (apart.payload["kwargs"], apart.run_at) == ({"text": "v2"}, later)


@pytest.mark.django_db
def test_replace_leaves_a_running_job_alone():
    first = sample_tasks.sync_order.using(unique=Unique(by=("order_id",), replace=("args",))).enqueue(4, note="old")
    Job.objects.filter(pk=first.id).update(state="running", lease_id="00000000-0000-0000-0000-000000000001")
    again = sample_tasks.sync_order.using(unique=Unique(by=("order_id",), replace=("args",))).enqueue(4, note="new")
    assert again.duplicate and again.kwargs == {"note": "old"}


@pytest.mark.django_db
def test_a_period_makes_one_key_per_window_and_can_cover_finished_jobs():
    first = sample_tasks.hourly_digest.enqueue(1)
    Job.objects.filter(pk=first.id).update(state="succeeded")
    assert sample_tasks.hourly_digest.enqueue(1).duplicate  # covered while succeeded, in this window
    key = Job.objects.get(pk=first.id).unique_key
    assert "@3600.0s#" in key or "@3600s#" in key


@pytest.mark.django_db
def test_bulk_enqueue_dedupes_within_the_batch_and_against_the_table(django_assert_num_queries):
    existing = sample_tasks.sync_order.enqueue(1)
    with django_assert_num_queries(1):
        results = enqueue_many(
            [
                (sample_tasks.sync_order, [1]),
                (sample_tasks.sync_order, [2]),
                (sample_tasks.add, [1, 2]),
                (sample_tasks.sync_order, [2], {"note": "again"}),
                (sample_tasks.sync_order, [3]),
            ]
        )
    assert [r.duplicate for r in results] == [True, False, False, True, False]
    assert results[0].id == existing.id
    assert results[3].id == results[1].id
    assert len({r.id for r in results}) == 4
    assert Job.objects.count() == 4
    assert [r.id for r in results if not r.duplicate] == sorted(r.id for r in results if not r.duplicate)


@pytest.mark.django_db
def test_a_duplicate_inside_a_rolled_back_transaction_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        sample_tasks.sync_order.enqueue(11)
        raise RuntimeError
    assert not sample_tasks.sync_order.enqueue(11).duplicate


@pytest.mark.django_db(transaction=True)
def test_eight_parallel_transactions_make_one_job():
    barrier = threading.Barrier(8)
    results, errors = [], []

    def enqueue():
        try:
            with transaction.atomic():
                # Every thread inserts inside an open transaction before any commits.
                connection.cursor().execute("SELECT 1")
                barrier.wait(timeout=30)
                results.append(sample_tasks.sync_order.enqueue(77))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert Job.objects.filter(task_path="tests.backend.sample_tasks.sync_order").count() == 1
    assert len({r.id for r in results}) == 1
    assert sorted(r.duplicate for r in results) == [False] + [True] * 7


@pytest.mark.parametrize(
    ("unique", "message"),
    [
        (Unique(by=("order",)), "Did you mean 'order_id'"),
        (Unique(by="order_id"), "did you mean ('order_id',)"),
        (Unique(states=("running",)), "must include 'ready'"),
        (Unique(states=("queued",)), "Unique.states"),
        (Unique(replace=("kwargs",)), "Unique.replace"),
        (Unique(period=0), "Unique.period"),
        (Unique(key=""), "Unique.key"),
        ("yes", "backwave.Unique"),
    ],
)
def test_bad_uniqueness_is_refused_at_definition(unique, message):
    with pytest.raises(InvalidTask, match=message.replace("(", r"\(").replace(")", r"\)")):
        sample_tasks.sync_order.using(unique=unique)


# Every life a unique job can lead, as the states it passes through: run to each end, cancelled
# before it ran (an operator), retried (running -> ready) and then run to success.
LIVES = [
    *(("ready", "running", end) for end in ("succeeded", "failed", "cancelled", "quarantined")),
    ("ready", "cancelled"),
    ("ready", "running", "ready", "running", "succeeded"),
]
FINISHED = ("succeeded", "failed", "cancelled", "quarantined")


def _state_sets():
    others = [state for state in UNIQUE_STATES if state != "ready"]
    for size in range(len(others) + 1):
        for chosen in itertools.combinations(others, size):
            yield ("ready", *chosen)


def _is_duplicate(task, order_id) -> bool:
    """Whether enqueuing now would be a duplicate; a job it inserts is rolled back."""
    with transaction.atomic():
        duplicate = task.enqueue(order_id).duplicate
        transaction.set_rollback(True)
    return duplicate


@pytest.mark.django_db
def test_every_set_of_states_accepted_is_honoured():
    # A duplicate is detected while the job is in a covered state. The one documented exception:
    # a job that left the covered states and comes back to ready (a retry) has let its key go
    # for good, so it never collides with a newer job that took the key meanwhile.
    order_id = 0
    for states in _state_sets():
        try:
            task = sample_tasks.sync_order.using(unique=Unique(by=("order_id",), states=states))
        except InvalidTask:
            continue
        for life in LIVES:
            order_id += 1
            job = task.enqueue(order_id)
            for step, state in enumerate(life):
                Job.objects.filter(pk=job.id).update(
                    state=state, lease_id="00000000-0000-0000-0000-000000000001" if state == "running" else None
                )
                if state == "ready" and step > 0:
                    expected = all(passed in states for passed in life[: step + 1])
                else:
                    expected = state in states
                assert _is_duplicate(task, order_id) is expected, f"states={states}, life {life[: step + 1]}"


@pytest.mark.parametrize("states", [s for s in _state_sets() if "running" not in s and set(s) & set(FINISHED)])
def test_finished_states_without_running_are_refused_at_definition(states):
    # A job reaches them by running (or cancelled while ready, which running would not cover
    # the same way): covered without 'running', the key would be let go before they are reached.
    with pytest.raises(
        InvalidTask, match=r"Unique.states of task 'tests.backend.sample_tasks.sync_order' covers .* without 'running'"
    ):
        sample_tasks.sync_order.using(unique=Unique(by=("order_id",), states=states))
    with pytest.raises(InvalidTask, match="without 'running'"):
        from django.tasks import task

        task(unique=Unique(states=states))(sample_tasks.sync_order.func)


@pytest.mark.django_db
@pytest.mark.parametrize("period", [1e-10, 0.0009, 1e300, float("inf"), float("nan"), True])
def test_a_period_out_of_range_is_refused_before_any_sql_and_the_transaction_stays_usable(period, django_assert_num_queries):
    """1e-10 s made the window number overflow bigint: a DataError that aborted the caller's
    transaction."""
    with transaction.atomic():
        kept = sample_tasks.sync_order.enqueue(1)
        with (
            django_assert_num_queries(0),
            pytest.raises(
                InvalidTask,
                match=r"Unique.period of task .* must be a number of seconds from 0.001 to 3,162,240,000 \(a century\)",
            ),
        ):
            sample_tasks.sync_order.using(unique=Unique(by=("order_id",), period=period)).enqueue(2)
        assert list(Job.objects.values_list("id", flat=True)) == [int(kept.id)]
    assert sample_tasks.sync_order.using(unique=Unique(by=("order_id",), period=0.001)).enqueue(3).duplicate is False


@pytest.mark.django_db
def test_the_limit_key_comes_from_the_named_argument_or_an_explicit_key():
    by_argument = sample_tasks.call_api.enqueue("acme", n=1)
    explicit = sample_tasks.call_api.using(limit_by=None).enqueue("acme")
    assert Job.objects.get(pk=by_argument.id).limit_key == "acme"
    assert Job.objects.get(pk=sample_tasks.call_api.enqueue(customer_id=42).id).limit_key == "42"
    assert Job.objects.get(pk=explicit.id).limit_key == "acme"  # using(limit_by=None) keeps the task's


@pytest.mark.django_db
def test_a_limit_key_that_cannot_be_a_key_is_refused_at_enqueue_and_nothing_is_written():
    with pytest.raises(InvalidTask, match="must be a string or an integer"):
        sample_tasks.call_api.enqueue({"id": 1})
    with pytest.raises(InvalidTask, match="sets both limit_by"):
        sample_tasks.call_api.using(limit_key="x")
    with pytest.raises(InvalidTask, match="Did you mean 'customer_id'"):
        sample_tasks.call_api.using(limit_by="customer")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_keys_from_arguments_store_whatever_the_arguments_hold():
    odd = 'caf\u00e9 "quoted" \\ \u4e2d'  # what a payload can hold
    first = sample_tasks.sync_order.enqueue(odd)
    assert sample_tasks.sync_order.enqueue(odd).id == first.id
    long = sample_tasks.sync_order.enqueue("x" * 1000)
    assert Job.objects.get(pk=long.id).unique_key.startswith("tests.backend.sample_tasks.sync_order:sha256:")
    with pytest.raises(InvalidTask, match="Unique.key"):
        sample_tasks.sync_order.using(unique=Unique(key="\ud800"))


# --- tasks that take a context ----------------------------------------------------------------
# The worker passes the context as the first argument; the call's arguments are the rest, so the
# keys are made by binding them to the signature without it.


@pytest.mark.django_db
def test_a_context_task_keys_its_uniqueness_by_the_calls_arguments():
    first = sample_tasks.sync_order_with_context.enqueue(7)
    assert Job.objects.get(pk=first.id).unique_key == 'tests.backend.sample_tasks.sync_order_with_context:{"order_id":7}'
    assert sample_tasks.sync_order_with_context.enqueue(order_id=7).duplicate is True
    assert sample_tasks.sync_order_with_context.enqueue(8).duplicate is False
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_a_context_tasks_default_is_not_every_calls_key():
    one = sample_tasks.sync_order_with_context_default.enqueue(1)
    two = sample_tasks.sync_order_with_context_default.enqueue(2)
    assert (one.duplicate, two.duplicate) == (False, False) and one.id != two.id
    assert sorted(Job.objects.values_list("unique_key", flat=True)) == [
        'tests.backend.sample_tasks.sync_order_with_context_default:{"order_id":1}',
        'tests.backend.sample_tasks.sync_order_with_context_default:{"order_id":2}',
    ]
    # The default itself is a key as any other value is.
    assert sample_tasks.sync_order_with_context_default.enqueue().duplicate is False
    assert sample_tasks.sync_order_with_context_default.enqueue(0).duplicate is True


@pytest.mark.django_db
def test_a_context_task_unique_by_all_arguments_leaves_the_context_out():
    result = sample_tasks.sync_everything_with_context.enqueue(3, note="x")
    assert (
        Job.objects.get(pk=result.id).unique_key
        == 'tests.backend.sample_tasks.sync_everything_with_context:{"note":"x","order_id":3}'
    )


@pytest.mark.django_db
def test_a_context_task_keys_its_limit_by_the_calls_argument():
    first = sample_tasks.call_api_with_context.enqueue("acme")
    second = sample_tasks.call_api_with_context.enqueue(customer_id="globex")
    default = sample_tasks.call_api_with_context.enqueue()
    keys = {str(id_): key for id_, key in Job.objects.values_list("id", "limit_key")}
    assert (keys[first.id], keys[second.id], keys[default.id]) == ("acme", "globex", "anyone")


@pytest.mark.django_db
def test_a_context_task_refuses_arguments_that_do_not_fit_the_call():
    with pytest.raises(InvalidTask, match=r"do not fit sync_order_with_context\(order_id\)"):
        sample_tasks.sync_order_with_context.enqueue(7, 8)
    # The context is not the caller's to pass.
    with pytest.raises(InvalidTask, match="do not fit"):
        sample_tasks.sync_order_with_context.enqueue(context=1, order_id=7)
    assert not Job.objects.exists()


@pytest.mark.parametrize("option", ["unique", "limit_by"])
def test_the_context_cannot_key_uniqueness_or_a_limit(option):
    values = {"unique": Unique(by=("context",)), "limit_by": "context"}
    for base in (sample_tasks.with_context, sample_tasks.with_context_and_kwargs):
        with pytest.raises(InvalidTask, match="the context BackWave passes, not an argument of the call"):
            base.using(**{option: values[option]})

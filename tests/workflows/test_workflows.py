"""Job dependencies, Job Output and runtime tags, on the deterministic test pump (real PostgreSQL,
the test's connection): the enqueue API, the release in the outcome statement, the failure
policies, the admin's cancel and retry, and what a raising handler keeps."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from backwave.ops import actions
from backwave.models import Dependency, Job, Transition
from backwave.observers import ObserverRegistry
from backwave.store import operator
from backwave.testing import DeterministicPump
from backwave.tasking.workflow import Dependency as After, InvalidDependency, Workflow, chain, dag, group

from . import observers, tasks


@pytest.fixture
def pump(db):
    with DeterministicPump(tasks=[tasks], pool_size=8) as pump:
        yield pump


def job(result) -> Job:
    return Job.objects.get(pk=result.id)


def test_a_diamond_runs_in_order_and_passes_outputs(pump):
    results = dag(
        {"a": (tasks.source, ["a", 1]), "b": (tasks.combine, ["b"]), "c": (tasks.combine, ["c"]), "d": (tasks.combine, ["d"])},
        after={"b": ["a"], "c": ["a"], "d": ["b", "c"]},
    )
    assert [job(results[name]).state for name in "abcd"] == ["ready", "waiting", "waiting", "waiting"]
    assert job(results["d"]).waiting_on == 2

    drained = pump.drain()

    assert drained.succeeded == 4 and drained.failed == drained.retried == 0
    order = [attempt.job_id for attempt in drained.attempts]
    ids = {name: int(results[name].id) for name in "abcd"}
    assert order[0] == ids["a"] and order[-1] == ids["d"]
    d = job(results["d"])
    assert d.return_value == 2 and d.output == {"value": 2, "seen": ["b", "c"], "name": "d"}
    assert job(results["a"]).tags == ["source-a"]


def test_a_chain_runs_one_after_another_with_its_outputs(pump):
    results = chain((tasks.source, ["x", 5]), (tasks.combine, ["y"]), (tasks.combine, ["z"]))
    assert pump.drain().succeeded == 3
    assert [job(r).return_value for r in results] == [5, 5, 5]
    assert job(results[2]).output["seen"] == ["y"]


def test_enqueue_after_existing_results_through_the_task(pump):
    first = tasks.source.enqueue("first", 2)
    second = tasks.source.enqueue("second", 3)
    total = tasks.combine.using(priority=5).enqueue("total", after=[first, second])
    assert job(total).state == "waiting" and job(total).priority == 5
    assert {d.ancestor_id for d in Dependency.objects.filter(job_id=total.id)} == {int(first.id), int(second.id)}

    pump.drain()

    assert job(total).return_value == 5


def test_a_fan_in_of_1000_releases_its_dependent_once(pump):
    members, fan_in = group([(tasks.noop, [n]) for n in range(1000)], then=(tasks.counts_running_ancestors,))
    assert job(fan_in).waiting_on == 1000

    drained = pump.drain()

    assert drained.succeeded == 1001
    assert [a.job_id for a in drained.attempts].count(int(fan_in.id)) == 1
    assert drained.attempts[-1].job_id == int(fan_in.id)  # after every member
    fan_in_job = job(fan_in)
    assert (fan_in_job.state, fan_in_job.return_value, fan_in_job.waiting_on) == ("succeeded", 0, 0)


def test_an_ancestor_that_already_succeeded_counts_at_enqueue(pump):
    done = tasks.source.enqueue("done", 4)
    pump.drain()
    later = tasks.combine.enqueue("later", after=[done])
    assert (job(later).state, job(later).waiting_on) == ("ready", 0)
    pump.drain()
    assert job(later).return_value == 4


@pytest.mark.parametrize(("policy", "expected_state"), [("cancel", "cancelled"), ("run", "succeeded"), ("hold", "held")])
def test_a_failing_ancestor_decides_each_dependent_by_its_policy(pump, policy, expected_state):
    flow = Workflow()
    bad = flow.add(tasks.fails)
    dependent = flow.add(tasks.noop, [1], after=[After(bad, on_failure=policy)])
    grandchild = flow.add(tasks.noop, [2], after=[dependent])
    bad_result, dependent_result, grandchild_result = flow.enqueue()

    pump.drain()

    assert job(bad_result).state == "failed"
    dependent_job = job(dependent_result)
    assert dependent_job.state == expected_state
    if policy == "cancel":
        assert dependent_job.reason == f"Cancelled: ancestor #{bad_result.id} failed."
        grandchild_job = job(grandchild_result)
        assert (grandchild_job.state, grandchild_job.reason) == (
            "cancelled",
            f"Cancelled: ancestor #{dependent_result.id} was cancelled.",
        )
    elif policy == "run":
        assert job(grandchild_result).state == "succeeded"
    else:
        assert dependent_job.reason.startswith(f"Held: ancestor #{bad_result.id} failed.")
        assert job(grandchild_result).state == "waiting"  # behind the held job, still waiting


def test_get_result_tells_waiting_held_ready_cancelled_and_failed_apart_and_why(pump):
    from django.tasks import TaskResultStatus as Status

    flow = Workflow()
    bad = flow.add(tasks.fails)
    cancelled = flow.add(tasks.noop, [1], after=[After(bad, on_failure="cancel")])
    held = flow.add(tasks.noop, [2], after=[After(bad, on_failure="hold")])
    waiting = flow.add(tasks.noop, [3], after=[held])
    enqueued = flow.enqueue()
    assert [r.state for r in enqueued] == ["ready", "waiting", "waiting", "waiting"]
    ready = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(4)

    pump.drain()

    bad_r, cancelled_r, held_r, waiting_r, ready_r = (r.task.get_result(r.id) for r in [*enqueued, ready])
    # Django's statuses as they are; BackWave's state beside them, and the reason it decided.
    assert [(r.status, r.state) for r in (bad_r, cancelled_r, held_r, waiting_r, ready_r)] == [
        (Status.FAILED, "failed"),
        (Status.FAILED, "cancelled"),
        (Status.READY, "held"),
        (Status.READY, "waiting"),
        (Status.READY, "ready"),
    ]
    bad_id = enqueued[0].id
    assert cancelled_r.reason == f"Cancelled: ancestor #{bad_id} failed."
    assert [(e.exception_class_path, e.traceback) for e in cancelled_r.errors] == [
        ("backwave.Cancelled", f"backwave.Cancelled: cancelled before it ran: ancestor #{bad_id} failed.\n")
    ]
    assert held_r.reason.startswith(f"Held: ancestor #{bad_id} failed.")
    assert (bad_r.reason, waiting_r.reason, ready_r.reason) == ("", "", "")


def test_retrying_a_failed_ancestor_from_the_admin_rearms_its_held_dependents(pump):
    flow = Workflow()
    bad = flow.add(tasks.fails)
    held = flow.add(tasks.noop, [1], after=[After(bad, on_failure="hold")])
    bad_result, held_result = flow.enqueue()
    pump.drain()
    assert job(held_result).state == "held"

    done = actions.retry_job_ids([int(bad_result.id)])

    assert done.changed == (int(bad_result.id),)
    rearmed = job(held_result)
    assert (rearmed.state, rearmed.reason, rearmed.waiting_on) == ("waiting", "", 1)
    Job.objects.filter(pk=bad_result.id).update(task_path=tasks.noop.module_path)  # the fix is deployed
    pump.drain()
    assert job(held_result).state == "succeeded"


def test_cancelling_an_ancestor_from_the_admin_cancels_its_dependents(pump):
    root = tasks.noop.using(run_after=None).enqueue(1)
    dependent = tasks.noop.enqueue(2, after=[root])
    runs_anyway = tasks.noop.enqueue(3, after=[After(root, on_failure="run")])

    done = actions.cancel_job_ids([int(root.id)])

    assert done.changed == (int(root.id),)
    assert (job(dependent).state, job(dependent).reason) == ("cancelled", f"Cancelled: ancestor #{root.id} was cancelled.")
    assert job(runs_anyway).state == "ready"
    assert pump.drain().succeeded == 1


def test_cancelling_a_waiting_or_held_job_cancels_its_own_dependents(pump):
    bad = tasks.fails.enqueue()
    held = tasks.noop.enqueue(1, after=[After(bad, on_failure="hold")])
    behind_held = tasks.noop.enqueue(2, after=[held])
    runs_anyway = tasks.noop.enqueue(3, after=[After(held, on_failure="run")])
    later = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(4)
    waiting = tasks.noop.enqueue(5, after=[later])
    behind_waiting = tasks.noop.enqueue(6, after=[waiting])
    pump.drain()
    assert (job(held).state, job(waiting).state) == ("held", "waiting")

    done = actions.cancel_job_ids([int(held.id), int(waiting.id)])

    assert done.changed == (int(held.id), int(waiting.id))
    assert (job(held).state, job(held).reason, job(waiting).state) == ("cancelled", "", "cancelled")
    assert (job(behind_held).state, job(behind_held).reason) == ("cancelled", f"Cancelled: ancestor #{held.id} was cancelled.")
    assert (job(behind_waiting).state, job(later).state) == ("cancelled", "ready")
    assert pump.drain().succeeded == 1  # runs_anyway
    assert job(runs_anyway).state == "succeeded"


@pytest.fixture
def observed_pump(db):
    observers.SEEN.clear()
    with DeterministicPump(tasks=[tasks], observers=[observers], pool_size=8) as pump:
        yield pump


def test_an_observer_of_cancels_hears_once_of_each_dependent_a_failure_cancels(observed_pump):
    a, b, c = chain((tasks.fails,), (tasks.noop, [1]), (tasks.noop, [2]))

    drained = observed_pump.drain()

    assert (job(a).state, job(b).state, job(c).state) == ("failed", "cancelled", "cancelled")
    # Neither ever ran: the attempt delivered is the job's attempts so far, none.
    assert sorted(observers.SEEN) == sorted([(int(b.id), 0, "cancelled", 1), (int(c.id), 0, "cancelled", 1)])
    assert drained.delivered == 2
    assert not Transition.objects.exists()  # delivered, so gone
    assert observed_pump.drain().delivered == 0 and len(observers.SEEN) == 2


def test_with_no_observer_of_cancels_a_cancelled_dependent_writes_no_transition(db):
    with DeterministicPump(tasks=[tasks], observers=[]) as pump:
        a, b = chain((tasks.fails,), (tasks.noop, [1]))
        pump.drain()
    assert job(b).state == "cancelled"
    assert not Transition.objects.exists()


def test_the_admins_cancel_is_heard_of_for_the_job_and_each_dependent_it_cancels(observed_pump, monkeypatch):
    monkeypatch.setattr(actions, "discovered_observers", lambda: observed_pump.observers)
    root = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1)
    dependent, behind = chain((tasks.noop, [2]), (tasks.noop, [3]), after=[root])
    runs_anyway = tasks.noop.enqueue(4, after=[After(root, on_failure="run")])

    assert actions.cancel_job_ids([int(root.id)]).changed == (int(root.id),)
    assert observed_pump.drain().delivered == 3

    assert sorted(observers.SEEN) == sorted((int(r.id), 0, "cancelled", 1) for r in (root, dependent, behind))
    assert job(runs_anyway).state == "succeeded"


def test_a_job_actions_cancel_notes_the_dependents_it_cancels_too(observed_pump):
    """act_on_jobs's cancel (the job actions' statement, beside cancel_jobs) settles the dependents
    in the same statement, and notes them by the same observed list."""
    root = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1)
    dependent = tasks.noop.enqueue(2, after=[root])
    selection = Job.objects.filter(pk=root.id).values("id").query.sql_with_params()
    with connection.cursor() as cursor:
        rows = operator.act_on_jobs(cursor, "cancel", selection, ["ready"], observed=observed_pump.observers.observed)
    assert [(job_id, done) for job_id, _state, done, _path in rows] == [(int(root.id), True)]
    assert sorted(Transition.objects.values_list("job_id", "attempt", "kind")) == sorted(
        [(int(root.id), 0, "cancelled"), (int(dependent.id), 0, "cancelled")]
    )
    unwatched = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(3)
    behind_unwatched = tasks.noop.enqueue(4, after=[unwatched])
    selection = Job.objects.filter(pk=unwatched.id).values("id").query.sql_with_params()
    with connection.cursor() as cursor:
        operator.act_on_jobs(cursor, "cancel", selection, ["ready"], observed=ObserverRegistry().observed)
    assert job(behind_unwatched).state == "cancelled"
    assert Transition.objects.count() == 2  # nobody watched those two


def test_a_snoozed_ancestor_keeps_its_dependents_waiting_until_it_succeeds(pump):
    ancestor = tasks.snoozes_then_records.enqueue()
    dependent = tasks.combine.enqueue("d", after=[ancestor])

    drained = pump.drain()

    assert (drained.snoozed, drained.succeeded) == (1, 2)
    assert [a.state for a in job(ancestor).attempt_log.order_by("number")] == ["snoozed", "succeeded"]
    assert job(ancestor).output == {"value": 2, "name": "snoozer"}
    assert (job(dependent).state, job(dependent).output["value"]) == ("succeeded", 2)


def test_a_discarded_ancestor_settles_its_dependents_as_a_failure(pump):
    ancestor = tasks.discards.enqueue()
    cancelled = tasks.noop.enqueue(1, after=[ancestor])
    runs_anyway = tasks.noop.enqueue(2, after=[After(ancestor, on_failure="run")])
    held = tasks.noop.enqueue(3, after=[After(ancestor, on_failure="hold")])

    pump.drain()

    assert (job(ancestor).state, job(ancestor).attempts) == ("failed", 1)  # no retry: discarded
    assert (job(cancelled).state, job(cancelled).reason) == ("cancelled", f"Cancelled: ancestor #{ancestor.id} failed.")
    assert (job(runs_anyway).state, job(held).state) == ("succeeded", "held")


def test_output_and_tags_survive_a_raising_handler(pump):
    result = tasks.records_then_raises.using(tags=["initial", "kept"]).enqueue()

    drained = pump.drain()

    assert drained.failed == 1
    failed = job(result)
    assert failed.output == {"progress": {"rows": 41}}
    assert failed.tags == ["kept", "partial", "needs-review"]
    assert "gave up after 41 rows" in failed.attempt_log.get().traceback


def test_a_cycle_is_refused_before_anything_is_written(db):
    with pytest.raises(InvalidDependency, match=r"cycle \('a' -> 'b' -> 'a'\)|cycle \('b' -> 'a' -> 'b'\)"):
        dag({"a": (tasks.noop,), "b": (tasks.noop,)}, after={"a": ["b"], "b": ["a"]})
    with pytest.raises(InvalidDependency, match="'c', which is not a step"):
        dag({"a": (tasks.noop,)}, after={"a": ["c"]})
    assert not Job.objects.exists()


def test_a_dag_step_named_by_digits_is_a_step_whatever_the_order(db):
    """A name in a DAG's after= is always a step: named like an existing job's id and not added
    yet when its dependent is, it was read as that job's id."""
    unrelated = tasks.noop.enqueue(0)
    name = str(unrelated.id)
    results = dag({"first": (tasks.noop, [1]), name: (tasks.noop, [2])}, after={"first": [name]})
    assert list(Dependency.objects.filter(job_id=int(results["first"].id)).values_list("ancestor_id", flat=True)) == [
        int(results[name].id)
    ]
    assert job(results["first"]).state == "waiting" and job(results[name]).state == "ready"


def test_a_dag_waits_for_an_existing_job_by_its_result_or_its_integer_id(db):
    first, second = tasks.noop.enqueue(1), tasks.noop.enqueue(2)
    results = dag(
        {"a": (tasks.noop,), "b": (tasks.noop,)}, after={"a": [first, After(int(second.id), on_failure="run")], "b": ["a"]}
    )
    edges = set(Dependency.objects.values_list("job_id", "ancestor_id", "on_failure"))
    a, b = int(results["a"].id), int(results["b"].id)
    assert edges == {(a, int(first.id), "cancel"), (a, int(second.id), "run"), (b, a, "cancel")}


def test_a_dag_refuses_a_job_id_as_text_and_step_names_that_are_not_text(db):
    existing = tasks.noop.enqueue(1)
    with pytest.raises(
        InvalidDependency, match=rf"'{existing.id}', which is not a step of the DAG .*pass its TaskResult or int\(id\)"
    ):
        dag({"a": (tasks.noop,)}, after={"a": [existing.id]})
    with pytest.raises(InvalidDependency, match="step names of a DAG are strings, got 1"):
        dag({1: (tasks.noop,), "b": (tasks.noop,)}, after={"b": [1]})
    assert list(Job.objects.values_list("id", flat=True)) == [int(existing.id)]


def test_a_dangling_ancestor_is_refused_with_nothing_written_and_the_transaction_usable(db):
    real = tasks.noop.enqueue(1)
    with pytest.raises(InvalidDependency, match=r"job 999999999 does not exist"):
        group([(tasks.noop, [n]) for n in range(3)], then=(tasks.noop,), after=[real, 999999999])
    assert list(Job.objects.values_list("id", flat=True)) == [int(real.id)]
    assert not Dependency.objects.exists()
    assert connection.in_atomic_block and not connection.needs_rollback


def test_a_workflow_leaves_the_callers_transaction_its_own_planner_setting(db):
    """The enqueue statement turns enable_seqscan off for its foreign keys' checks (queries.sql)."""
    group([(tasks.noop, [n]) for n in range(3)], then=(tasks.noop,))
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_seqscan')")
        assert cursor.fetchone() == ("on",)


def test_an_ancestor_that_already_failed_is_refused_unless_the_policy_is_run(pump):
    bad = tasks.fails.enqueue()
    pump.drain()
    with pytest.raises(InvalidDependency, match=rf"job {bad.id} is already failed"):
        tasks.noop.enqueue(after=[bad])
    anyway = tasks.noop.enqueue(after=[After(bad, on_failure="run")])
    assert job(anyway).state == "ready"


def test_the_api_is_on_the_package():
    import backwave
    from backwave.tasking import context, workflow

    assert (backwave.chain, backwave.group, backwave.dag, backwave.Workflow) == (chain, group, dag, Workflow)
    assert (backwave.Dependency, backwave.InvalidDependency, backwave.JobContext) == (
        After,
        InvalidDependency,
        context.JobContext,
    )
    assert issubclass(workflow.InvalidDependency, __import__("django.tasks.exceptions").tasks.exceptions.InvalidTask)


def test_bad_after_values_are_refused_where_they_are_written(db):
    with pytest.raises(InvalidDependency, match="takes a list of ancestors"):
        tasks.noop.enqueue(after=tasks.noop.enqueue(1))
    with pytest.raises(InvalidDependency, match="on_failure must be one of"):
        After(1, on_failure="ignore")
    with pytest.raises(InvalidDependency, match="takes TaskResults, job ids"):
        tasks.noop.enqueue(after=[object()])
    other = Workflow()
    step = other.add(tasks.noop)
    with pytest.raises(InvalidDependency, match="another Workflow"):
        tasks.noop.enqueue(after=[step])


def test_context_refuses_what_it_cannot_store_inside_the_attempt(db):
    from backwave.store.storable import UnstorableResult
    from backwave.tasking.context import JobContext
    from backwave.tasking.results import task_result_for_attempt

    result = task_result_for_attempt(
        task=tasks.noop,
        job_id=1,
        attempt=1,
        worker_id="w",
        payload={"args": [], "kwargs": {}},
        backend="default",
        enqueued_at=None,
        started_at=None,
        attempted_at=None,
        earlier_worker_ids=(),
    )
    context = JobContext(task_result=result, job_id=1, max_output_bytes=100, resolver=lambda job_id: [])
    with pytest.raises(UnstorableResult, match=r"output 'x' holds NaN at \[0\]"):
        context.output("x", [float("nan")])
    with pytest.raises(UnstorableResult, match="over BACKWAVE\\['MAX_RESULT_BYTES'\\]"):
        context.output("big", "y" * 200)
    with pytest.raises(ValueError, match="a tag is a string"):
        context.tag("bad\x00tag")
    context.output("ok", 1)
    assert context.close() == ({"ok": 1}, (), ())
    with pytest.raises(RuntimeError, match="is over"):
        context.tag("late")


def test_an_async_task_reads_its_ancestors_and_records_output(pump):
    first = tasks.source.enqueue("one", 1)
    reader = tasks.async_reader.enqueue(after=[first])
    assert pump.drain().succeeded == 2
    assert (job(reader).return_value, job(reader).output) == (1, {"seen": ["one"]})

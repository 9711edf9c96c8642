"""Fixtures of the admin tests: users with and without the action permissions, and row makers."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import F
from django.db.models.functions import Now

from backwave.models import Attempt, Job, Pump, Schedule
from tests.factories import JobFactory, make_lease

VIEW_PERMISSIONS = ["view_job", "view_queue", "view_pump", "view_schedule", "view_transition"]
ACTION_PERMISSIONS = ["retry_job", "cancel_job", "pause_queue", "limit_queue", "toggle_schedule", "redeliver_transition"]


def staff_user(username: str, codenames: list[str]) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="backwave", codename__in=codenames))
    return user


@pytest.fixture
def readonly_user(db):
    """Staff with the view permissions only: sees every BackWave page, can run no action."""
    return staff_user("viewer", VIEW_PERMISSIONS)


@pytest.fixture
def operator_user(db):
    """Staff with the view permissions and every action's permission (not a superuser)."""
    return staff_user("operator", VIEW_PERMISSIONS + ACTION_PERMISSIONS)


@pytest.fixture
def readonly_client(client, readonly_user):
    client.force_login(readonly_user)
    return client


@pytest.fixture
def operator_client(client, operator_user):
    client.force_login(operator_user)
    return client


def make_job(**fields) -> Job:
    """A job in any state; a running one gets a lease id, a finished one a finish time."""
    state = fields.get("state", "ready")
    if state == "running":
        fields.setdefault("lease_id", uuid.uuid4())
        fields.setdefault("attempts", 1)
        fields.setdefault("worker_id", "host:1:default:0")
    job = JobFactory(**fields)
    if state in ("succeeded", "failed", "cancelled", "quarantined") and "finished_at" not in fields:
        Job.objects.filter(pk=job.pk).update(finished_at=Now())
        job.refresh_from_db()
    return job


def make_attempt(job: Job, number: int, state: str = "failed", **fields) -> Attempt:
    fields.setdefault("worker_id", f"host:1:default:{number}")
    if state in ("failed", "quarantined"):
        fields.setdefault("error_class", "builtins.RuntimeError")
        fields.setdefault(
            "traceback", f'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: boom #{number}\n'
        )
    attempt = Attempt.objects.create(job=job, number=number, state=state, **fields)
    Attempt.objects.filter(pk=attempt.pk).update(started_at=F("finished_at") - timedelta(milliseconds=250))
    return attempt


def make_pump(
    worker_id: str,
    status: str = "healthy",
    *,
    reason: str = "",
    group: str = "default",
    age: float = 0.0,
    lease: float = 30.0,
    lease_expires_in: float | None = 30.0,
    in_flight: int = 3,
    queues: tuple[str, ...] = ("default",),
) -> Pump:
    """A pump's row as it last reported, and (unless ``lease_expires_in`` is None) its lease, live
    for that many seconds more, lapsed when negative: a running pump holds one."""
    pump = Pump.objects.create(
        worker_id=worker_id,
        group=group,
        hostname="node-1",
        pid=4242,
        status=status,
        reason=reason,
        in_flight=in_flight,
        lease_duration=lease,
        queues=list(queues),
    )
    if lease_expires_in is not None:
        make_lease(worker_id, lease_expires_in, group=group)
    if age:
        Pump.objects.filter(pk=pump.pk).update(last_heartbeat_at=Now() - timedelta(seconds=age))
    return pump


def make_schedule(name: str, **fields) -> Schedule:
    fields.setdefault("task_path", "project.demo.tasks.fast_job")
    fields.setdefault("cron", "*/5 * * * *")
    return Schedule.objects.create(name=name, **fields)

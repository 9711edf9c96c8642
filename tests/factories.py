"""factory-boy factories for BackWave's models."""

import uuid
from datetime import timedelta

import factory
from django.db.models.functions import Now

from backwave.models import Job, JobState, Lease


class JobFactory(factory.django.DjangoModelFactory):
    """A ready job, due now by the database clock (``run_at`` left to its ``db_default``)."""

    class Meta:
        model = Job

    task_path = "tests.tasks.noop"
    queue = "default"
    priority = 0
    payload = factory.Sequence(lambda n: {"args": [n], "kwargs": {}})
    state = JobState.READY
    max_attempts = 3


def make_lease(
    worker_id: str,
    expires_in: float = 30.0,
    *,
    group: str = "default",
    hostname: str = "node-1",
    pid: int = 4242,
    using: str = "default",
) -> Lease:
    """A pump's lease expiring ``expires_in`` seconds from now by the database clock (lapsed when negative)."""
    return Lease.objects.using(using).create(
        id=uuid.uuid4(),
        worker_id=worker_id,
        group=group,
        hostname=hostname,
        pid=pid,
        expires_at=Now() + timedelta(seconds=expires_in),
    )

"""Helpers for the PostgreSQL store tests: database-clock reads and direct row set-ups."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from backwave.models import Job
from tests.factories import JobFactory


@dataclass(frozen=True)
class LeaseRef:
    id: uuid.UUID
    worker_id: str


def db_now() -> datetime:
    """The database clock, read on Django's connection (autocommit: the statement's start)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def lapse(lease_id: uuid.UUID, *, seconds_ago: float = 1.0) -> None:
    """Move a lease's expiry into the past by the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE backwave_lease SET expires_at = now() - make_interval(secs => %s) WHERE id = %s",
            [seconds_ago, lease_id],
        )


def make_jobs(count: int, **fields) -> list[Job]:
    """Insert ``count`` ready jobs with one statement; returns them in id order."""
    jobs = Job.objects.bulk_create(JobFactory.build_batch(count, **fields))
    return sorted(jobs, key=lambda job: job.pk)


def ago(seconds: float) -> datetime:
    """A timestamp ``seconds`` in the past, for ordering fixtures only (run_at of test rows)."""
    return timezone.now() - timedelta(seconds=seconds)


def states(ids) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=list(ids)).values_list("pk", "state"))

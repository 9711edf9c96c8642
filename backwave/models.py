"""BackWave's tables.

Three tables carry the engine:

* ``Job``: one row per unit of work. The claim path reads only rows in state ``ready`` through a
  partial index that matches the claim's ORDER BY, so finished rows never slow a poll down.
* ``Lease``: one row per live pump. Jobs under it carry its id (``lease_id``); a heartbeat renews
  the single lease row however many jobs it covers, and the Effect-Once fence compares tokens.
* ``Attempt``: one row per finished attempt (the outcome), written in the same statement that
  moves the job on.

The hot path uses hand-written SQL in ``backwave/store/``; these models are the schema, the
admin's view and the tasks backend's read path.
"""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


class JobState(models.TextChoices):
    READY = "ready", "Ready"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    QUARANTINED = "quarantined", "Quarantined"


FINISHED_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUARANTINED})


class Job(models.Model):
    """One unit of work: a wire name, a JSON payload and the bookkeeping of its attempts."""

    task_path = models.CharField(max_length=255, help_text="Wire name: the task's import path, resolved only through the worker's registry.")
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0, help_text="-100 to 100; higher runs first.")
    payload = models.JSONField(help_text='{"args": [...], "kwargs": {...}}')
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.READY)
    backend = models.CharField(max_length=64, default="default", help_text="Alias of the TASKS backend that enqueued the job.")
    tags = ArrayField(models.CharField(max_length=64), default=list, blank=True)

    run_at = models.DateTimeField(db_default=Now(), help_text="Not claimed before this moment (database clock).")
    enqueued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True, help_text="Start of the first attempt.")
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    attempts = models.IntegerField(default=0, help_text="Counted when the job is claimed, so a job that kills its worker still runs out of attempts.")
    max_attempts = models.IntegerField(default=1)
    backoff_base = models.FloatField(default=1.0, help_text="Seconds before the first retry; doubles on each further attempt.")
    backoff_max = models.FloatField(default=3600.0)

    lease_id = models.UUIDField(null=True, blank=True, help_text="The lease the job runs under while running.")
    worker_id = models.CharField(max_length=255, blank=True, default="", help_text="Pump identity of the latest attempt.")
    return_value = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [
            # Serves the claim: WHERE state = 'ready' AND queue = ANY(...) AND run_at <= now()
            # ORDER BY priority DESC, run_at, id. Only ready rows are in it, however many
            # finished jobs pile up.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="backwave_job_claim",
                condition=models.Q(state="ready"),
            ),
            # Lease expiry and release find a lease's running jobs without touching the rest.
            models.Index(fields=["lease_id"], name="backwave_job_running_lease", condition=models.Q(state="running")),
            # Retention and the admin's finished-job views. Partial, so that it never holds a
            # ready or running row: the planner cannot mistake it for a way to the claim's rows.
            models.Index(
                fields=["state", "finished_at"],
                name="backwave_job_finished",
                condition=models.Q(state__in=["succeeded", "failed", "cancelled", "quarantined"]),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(priority__gte=-100, priority__lte=100), name="backwave_job_priority_range"),
            models.CheckConstraint(condition=models.Q(max_attempts__gte=1), name="backwave_job_max_attempts_positive"),
            models.CheckConstraint(
                condition=~models.Q(state="running") | models.Q(lease_id__isnull=False),
                name="backwave_job_running_has_lease",
            ),
        ]

    def __str__(self):
        return f"{self.task_path} #{self.pk} ({self.state})"


class Lease(models.Model):
    """A pump's claim on the rows it runs, stamped and expired by the database clock."""

    id = models.UUIDField(primary_key=True)
    worker_id = models.CharField(max_length=255, help_text="Pump identity: host, pid, group and pump number.")
    group = models.CharField(max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    created_at = models.DateTimeField(db_default=Now())
    renewed_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["expires_at"], name="backwave_lease_expires")]

    def __str__(self):
        return f"{self.worker_id} until {self.expires_at:%H:%M:%S}"


class AttemptState(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    QUARANTINED = "quarantined", "Quarantined"
    LAPSED = "lapsed", "Lease lapsed"


class Attempt(models.Model):
    """The outcome of one finished attempt of a job."""

    job = models.ForeignKey(Job, on_delete=models.DB_CASCADE, related_name="attempt_log")
    number = models.IntegerField()
    state = models.CharField(max_length=16, choices=AttemptState.choices)
    worker_id = models.CharField(max_length=255)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(db_default=Now())
    error_class = models.CharField(max_length=255, blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    return_value = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [
            # The Effect-Once fence keeps a late writer out; this makes a double apply impossible
            # even if the fence were ever wrong.
            models.UniqueConstraint(fields=["job", "number"], name="backwave_attempt_once"),
        ]

    def __str__(self):
        return f"job {self.job_id} attempt {self.number}: {self.state}"

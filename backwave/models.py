"""BackWave's tables.

Six tables carry the engine:

* ``Job``: one row per unit of work. The claim path reads only rows in state ``ready`` through a
  partial index that matches the claim's ORDER BY, so finished rows never slow a poll down.
* ``Lease``: one row per live pump. Jobs under it carry its id (``lease_id``); a heartbeat renews
  the single lease row however many jobs it covers, and the Effect-Once fence compares tokens.
* ``Attempt``: one row per finished attempt (the outcome), written in the same statement that
  moves the job on.
* ``Schedule``: a recurring job (cron), declared in ``BACKWAVE["SCHEDULES"]`` and synced at worker
  start; maintenance mints each due slot as a job, once, enforced by a unique (schedule, slot).
* ``Pump``: the health each pump reports (healthy, degraded, halted and why), for the admin and
  ``manage.py backwave_health``.
* ``Queue``: a queue's cluster-wide concurrency limit and pause switch, written by operators (the
  admin, ``manage.py backwave_queue``); a queue without a row is unlimited and running.

The hot path uses hand-written SQL in ``backwave/store/``; these models are the schema, the
admin's view and the tasks backend's read path.
"""

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Case, Exists, F, Func, IntegerField, OuterRef, Value, When
from django.db.models.functions import Now

from .core import health
from .queue_rules import QUEUE_NAME_DATABASE_REGEX, QUEUE_NAME_PATTERN, QUEUE_NAME_RULE


class JobState(models.TextChoices):
    WAITING = "waiting", "Waiting"  # for its ancestors (Dependency): not claimable yet
    HELD = "held", "Held"  # an ancestor failed under an on_failure="hold" dependency: an operator decides
    READY = "ready", "Ready"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    QUARANTINED = "quarantined", "Quarantined"


FINISHED_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUARANTINED})


class Queue(models.Model):
    """A queue's cluster-wide settings: a concurrency limit and a pause switch.

    A queue needs no row to exist: jobs name their queue, and a queue without a row is unlimited
    and running. A row is written when an operator pauses or limits the queue (the admin, or
    ``manage.py backwave_queue``); workers read it when they claim.
    """

    name = models.CharField(
        max_length=64, primary_key=True, validators=[RegexValidator(QUEUE_NAME_PATTERN.pattern, f"Use {QUEUE_NAME_RULE}.")]
    )
    concurrency_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="At most this many of the queue's jobs run at once across every worker; empty: unlimited.",
    )
    paused = models.BooleanField(default=False, help_text="A paused queue is not claimed from; running jobs finish.")
    # Admission (BACKWAVE["QUEUES"], written by every worker that claims the queue at start-up;
    # the admin shows them, settings change them). See claim_jobs_admitted in store/queries.sql.
    key_concurrency_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many running jobs per limit key (the task's limit_by/limit_key) across every worker; empty: unlimited.",
    )
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="At most this many job starts per rate period across every worker; empty: unlimited."
    )
    key_rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="At most this many job starts per rate period for each limit key; empty: unlimited."
    )
    rate_period = models.FloatField(
        null=True, blank=True, help_text="Seconds of one rate window (windows are aligned to the database clock)."
    )
    # The rate limit's current window, debited by the claim that starts jobs in it.
    rate_window_start = models.DateTimeField(null=True, blank=True)
    rate_window_used = models.IntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(name__regex=QUEUE_NAME_DATABASE_REGEX), name="backwave_queue_name_valid"),
            models.CheckConstraint(
                condition=models.Q(concurrency_limit__isnull=True) | models.Q(concurrency_limit__gte=1),
                name="backwave_queue_limit_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(key_concurrency_limit__isnull=True) | models.Q(key_concurrency_limit__gte=1),
                name="backwave_queue_key_limit_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(rate_limit__isnull=True, key_rate_limit__isnull=True, rate_period__isnull=True)
                | (models.Q(rate_period__gt=0) & (models.Q(rate_limit__gte=1) | models.Q(key_rate_limit__gte=1))),
                name="backwave_queue_rate_limit_valid",
            ),
        ]
        permissions = [("pause_queue", "Can pause and resume queues"), ("limit_queue", "Can set a queue's concurrency limit")]

    def __str__(self):
        return self.name


class KeyRateWindow(models.Model):
    """A limit key's current rate window in a queue under a per-key rate limit: the claim that
    starts the key's jobs debits it (see claim_jobs_admitted). One row per key and queue with
    starts in the current window: the claim moves a row on in place, and deletes the rows of
    windows that have passed."""

    queue = models.CharField(max_length=64)
    limit_key = models.CharField(max_length=255)
    window_start = models.DateTimeField()
    used = models.IntegerField()

    class Meta:
        db_table = "backwave_key_rate_window"  # the name queries.sql uses
        constraints = [models.UniqueConstraint(fields=["queue", "limit_key"], name="backwave_key_rate_window_key")]
        # The claim reads the keys used up in the current window: only this window's rows.
        indexes = [models.Index(fields=["queue", "window_start"], name="backwave_key_rate_window_now")]

    def __str__(self):
        return f"{self.queue}/{self.limit_key}: {self.used} since {self.window_start}"


class Schedule(models.Model):
    """A recurring job: a cron expression and what to enqueue at each of its slots.

    Rows mirror ``BACKWAVE["SCHEDULES"]``: every worker writes the declared definitions at start
    and disables rows that are no longer declared. The job fields (queue, priority, retry options,
    backend, tags) are resolved from the task when the row is written, so minting a slot is one
    INSERT ... SELECT. ``next_run`` is NULL until the first maintenance run computes it (and again
    after the cron expression changes or the schedule is re-enabled): a new schedule starts at
    its next slot, it does not catch up on slots from before it existed.
    """

    name = models.CharField(max_length=100, unique=True)
    task_path = models.CharField(max_length=255, help_text="Wire name of a registered task.")
    cron = models.CharField(
        max_length=255,
        help_text="Cron expression (5 fields, or 6 with seconds last), evaluated in settings.TIME_ZONE against the database clock.",
    )
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.IntegerField(default=3)
    backoff_base = models.FloatField(default=1.0)
    backoff_max = models.FloatField(default=3600.0)
    backend = models.CharField(max_length=64, default="default")
    tags = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    timeout = models.FloatField(
        null=True, blank=True, help_text="Seconds each minted job's attempt may run (the task's time limit)."
    )
    limit_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="The per-key concurrency key of each minted job (the task's limit_by or limit_key, from the schedule's arguments).",
    )
    enabled = models.BooleanField(default=True)
    last_slot = models.DateTimeField(null=True, blank=True, help_text="The latest slot minted as a job.")
    next_run = models.DateTimeField(null=True, blank=True, help_text="The next slot due (database clock); NULL until computed.")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority__gte=-100, priority__lte=100), name="backwave_schedule_priority_range"
            ),
            models.CheckConstraint(condition=models.Q(max_attempts__gte=1), name="backwave_schedule_max_attempts_positive"),
        ]
        permissions = [("toggle_schedule", "Can enable and disable schedules")]

    def __str__(self):
        return f"{self.name} ({self.cron})"


class Job(models.Model):
    """One unit of work: a wire name, a JSON payload and the bookkeeping of its attempts."""

    task_path = models.CharField(
        max_length=255, help_text="Wire name: the task's import path, resolved only through the worker's registry."
    )
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

    attempts = models.IntegerField(
        default=0,
        help_text="Counted when the job is claimed, so a job that kills its worker still runs out of attempts"
        " (less forgiven_attempts: the limit is on attempts - forgiven_attempts).",
    )
    max_attempts = models.IntegerField(default=1)
    # A worker that dies takes every job under its lease down; only one of them may have caused
    # it. So the first lapse since a job's last outcome is forgiven (not counted against
    # max_attempts, the job marked suspect), and a suspect runs as the only suspect of its pump:
    # a suspect whose lease lapses again pays (see expire_leases in store/queries.sql).
    forgiven_attempts = models.IntegerField(
        default=0, db_default=0, help_text="Attempts not counted against max_attempts: lapsed with their worker, or snoozed."
    )
    suspect = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Its last attempt lapsed with its worker and no outcome came since: never claimed beside another suspect.",
    )
    backoff_base = models.FloatField(default=1.0, help_text="Seconds before the first retry; doubles on each further attempt.")
    backoff_max = models.FloatField(default=3600.0)

    timeout = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds one attempt may run; past it the attempt fails with backwave.TimeLimitExceeded (empty: no limit).",
    )
    # A cancel of a running job is a request: the worker holding it is told (NOTIFY, and its
    # heartbeat's answer) and ends the attempt cancelled. Kept after that, so the error names
    # who cancelled, and so a job whose worker died meanwhile is cancelled at its next claim.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(
        max_length=255, blank=True, default="", db_default="", help_text="Who cancelled the job: admin:<user>, api, or command."
    )
    progress = models.JSONField(
        null=True, blank=True, help_text="The handler's last context.set_progress(); written with the heartbeat."
    )
    metadata = models.JSONField(
        null=True, blank=True, help_text="The handler's context.metadata, written with the heartbeat and the outcome."
    )

    lease_id = models.UUIDField(null=True, blank=True, help_text="The lease the job runs under while running.")
    worker_id = models.CharField(max_length=255, blank=True, default="", help_text="Pump identity of the latest attempt.")
    return_value = models.JSONField(null=True, blank=True)
    # Named values a handler recorded with context.output(), merged over its attempts (a later
    # attempt's value of a name wins); its dependents read them through their JobContext.
    output = models.JSONField(
        null=True, blank=True, help_text="Job Output: what the handler recorded with context.output(name, value)."
    )
    # Ancestors (Dependency rows) that have not succeeded yet: the dependent is ready when this
    # reaches 0, in the same statement that applies its last ancestor's success.
    waiting_on = models.IntegerField(default=0, db_default=0, help_text="Ancestors this job still waits for.")
    # Set, for good, at the commit of an enqueue of a job that waits for this one (migration
    # 0022's deferred trigger; in the batch that inserts both, at the insert). The outcome write
    # of a job without it settles nothing; the commit updates the row, so a write racing it finds
    # the row changed and passes it over (busy) to a write that settles (see write_outcomes_plain).
    has_dependents = models.BooleanField(default=False, db_default=False, help_text="Some job waits for this one.")
    reason = models.TextField(
        blank=True,
        default="",
        db_default="",
        help_text="Why BackWave cancelled or holds this job: the ancestor whose failure decided it.",
    )

    # Set on jobs minted from a schedule. No index of its own: the partial unique index below
    # (schedule_id leading) serves lookups by schedule, and ordinary enqueues never touch it.
    schedule = models.ForeignKey(
        Schedule, null=True, blank=True, on_delete=models.DB_SET_NULL, db_index=False, related_name="jobs"
    )
    schedule_slot = models.DateTimeField(null=True, blank=True, help_text="The schedule slot this job was minted for.")
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="The W3C trace context of the enqueue (traceparent, tracestate): each attempt's span is its child.",
    )

    # Unique jobs. unique_key is set only while the job is in one of unique_states: a trigger
    # (migration 0008) clears it for good when the job moves to a state its uniqueness does not
    # cover, so a later move back (a retry) can never collide with a newer job of the same key,
    # and the unique index needs no predicate on state.
    unique_key = models.TextField(null=True, blank=True, help_text="Task, key and period window; while set, no other job has it.")
    unique_states = ArrayField(models.CharField(max_length=16), null=True, blank=True, help_text="States the uniqueness covers.")
    unique_replace = ArrayField(
        models.CharField(max_length=16),
        null=True,
        blank=True,
        help_text="What a duplicate enqueue replaces on this job while ready.",
    )
    # Per-key concurrency (and its rate window's queue): the key the task computed at enqueue.
    limit_key = models.CharField(max_length=255, null=True, blank=True, help_text="Key of the queue's per-key concurrency limit.")

    class Meta:
        indexes = [
            # Serves the claim: WHERE state = 'ready' AND queue = ANY(...) AND run_at <= now()
            # ORDER BY priority DESC, run_at, id. Only ready rows are in it, however many
            # finished jobs pile up.
            models.Index(
                "queue", models.F("priority").desc(), "run_at", "id", name="backwave_job_claim", condition=models.Q(state="ready")
            ),
            # The claim's one suspect (at most one per claim, see claim_jobs_*): few rows, usually
            # none, so looking for one costs a probe of an empty index, not a walk of the backlog.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="backwave_job_claim_suspect",
                condition=models.Q(state="ready", suspect=True),
            ),
            # The claim's check that its lease runs no suspect yet: a probe of an index that only
            # holds running suspects.
            models.Index(
                fields=["lease_id"], name="backwave_job_running_suspect", condition=models.Q(state="running", suspect=True)
            ),
            # Lease expiry and release find a lease's running jobs without touching the rest.
            models.Index(fields=["lease_id"], name="backwave_job_running_lease", condition=models.Q(state="running")),
            # A limited queue's claim counts its running jobs (see lock_limited_queues).
            models.Index(fields=["queue"], name="backwave_job_running_queue", condition=models.Q(state="running")),
            # The per-key concurrency limit counts a queue's running jobs per key (claim_jobs_admitted).
            models.Index(
                fields=["queue", "limit_key"],
                name="backwave_job_running_key",
                condition=models.Q(state="running", limit_key__isnull=False),
            ),
            # Retention and the admin's finished-job views. Partial, so that it never holds a
            # ready or running row: the planner cannot mistake it for a way to the claim's rows.
            models.Index(
                fields=["state", "finished_at"],
                name="backwave_job_finished",
                condition=models.Q(state__in=["succeeded", "failed", "cancelled", "quarantined"]),
            ),
            # The admin's per-queue failed and quarantined counts and its list of queues with
            # failures: bounded index-only scans instead of reading every finished row. Only
            # failing outcomes write an entry; the claim and success paths never touch it.
            models.Index(
                fields=["queue", "state"],
                name="backwave_job_failed_queue",
                condition=models.Q(state__in=["failed", "quarantined"]),
            ),
            # The same for the workflow jobs held back (waiting for their ancestors, or held for
            # an operator): the Queues page counts them and finds the queues that have any. Only
            # dependents write an entry (a release makes the row ready, which it leaves out).
            # The second conjunct keeps it out of reach of every other statement: with the first
            # alone, the settling of dependents ("j.state IN ('waiting', 'held')", by id) read
            # the whole index instead of probing the primary key whenever the statistics said it
            # was empty, and it holds a dead entry for every dependent released since the last
            # VACUUM. Only the overview states "queue <> ''" (no queue name is empty).
            models.Index(
                fields=["queue", "state"],
                name="backwave_job_waiting_held",
                condition=models.Q(state__in=["waiting", "held"]) & ~models.Q(queue=""),
            ),
            # The admin's and backwave_jobs' search by argument value: payload @> '{"kwargs":
            # {"order_id": 42}}'. jsonb_path_ops indexes only containment (@>, @?, @@), which
            # is all the search asks, and is a third the size of the default jsonb_ops.
            # Partial, leaving running rows out: a claim (ready -> running) then writes no GIN
            # entry (it tripled the claim's WAL bytes otherwise); the search looks for running
            # jobs through the small running-jobs index instead (backwave/ops/search.py).
            # The second conjunct keeps the index out of reach of every statement that does not
            # search: "NOT state = 'running'" alone is implied by "state = 'ready'", and with
            # statistics from an empty table the claim read this index as a bitmap over every
            # row (10 ms a claim at 20,000 jobs). Only the search states "payload <> '{}'"
            # (ops.search.SEARCHABLE), and no payload that '{}' has can match a search anyway.
            GinIndex(
                fields=["payload"],
                name="backwave_job_payload",
                opclasses=["jsonb_path_ops"],
                condition=~models.Q(state="running") & ~models.Q(payload={}),
            ),
            # The tag filter: tags @> ARRAY['tenant:7'], partial for the same reasons (a job
            # without tags matches no tag).
            GinIndex(fields=["tags"], name="backwave_job_tags", condition=~models.Q(state="running") & ~models.Q(tags=[])),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(priority__gte=-100, priority__lte=100), name="backwave_job_priority_range"),
            models.CheckConstraint(condition=models.Q(max_attempts__gte=1), name="backwave_job_max_attempts_positive"),
            models.CheckConstraint(
                condition=~models.Q(state="running") | models.Q(lease_id__isnull=False), name="backwave_job_running_has_lease"
            ),
            # Each schedule slot becomes one job however many nodes mint it at once: the mint
            # is INSERT ... ON CONFLICT DO NOTHING against this index. Partial, so the hot
            # enqueue path (schedule_id NULL) never writes an entry.
            models.UniqueConstraint(
                fields=["schedule", "schedule_slot"],
                condition=models.Q(schedule__isnull=False),
                name="backwave_job_schedule_slot_once",
            ),
            # Unique jobs: enqueue_unique_many is INSERT ... ON CONFLICT against this index, so
            # two enqueues in two transactions make one job. Partial: plain jobs never write to it.
            models.UniqueConstraint(
                fields=["unique_key"], condition=models.Q(unique_key__isnull=False), name="backwave_job_unique_key"
            ),
            models.CheckConstraint(
                condition=models.Q(unique_key__isnull=True) | models.Q(unique_states__contains=["ready"]),
                name="backwave_job_unique_covers_ready",
            ),
        ]
        permissions = [
            ("retry_job", "Can retry failed or quarantined jobs"),
            ("cancel_job", "Can cancel ready or scheduled jobs"),
            ("cancel_running_job", "Can cancel running jobs"),
        ]

    def __str__(self):
        return f"{self.task_path} #{self.pk} ({self.state})"


class DependencyPolicy(models.TextChoices):
    """What a dependent does when its ancestor fails for good, is cancelled or quarantined."""

    CANCEL = "cancel", "Cancel the dependent"
    RUN = "run", "Run the dependent anyway"
    HOLD = "hold", "Hold the dependent for an operator"


class Dependency(models.Model):
    """An edge of a workflow: ``job`` waits until ``ancestor`` has succeeded.

    The primary key (job, ancestor) lists a job's ancestors; the index on ``ancestor`` is how
    the outcome statement finds the dependents of the jobs it settles, so releasing a fan-out of
    10,000 is one index range scan in that statement. Both foreign keys cascade: a purged job
    takes its edges along. They are NOT DEFERRABLE (migration 0017), so the statement that
    writes the edges checks them, under its own planner setting (enqueue_with_dependencies);
    Django would rebuild a key it alters as deferrable (a test reads the catalog).
    """

    pk = models.CompositePrimaryKey("job", "ancestor")
    job = models.ForeignKey(Job, on_delete=models.DB_CASCADE, related_name="ancestor_links", db_index=False)
    ancestor = models.ForeignKey(Job, on_delete=models.DB_CASCADE, related_name="dependent_links", db_index=False)
    on_failure = models.CharField(max_length=8, choices=DependencyPolicy.choices, default=DependencyPolicy.CANCEL)
    position = models.IntegerField(default=0, help_text="The ancestor's place in the after= list it was given in.")

    class Meta:
        indexes = [models.Index(fields=["ancestor"], name="backwave_dependency_ancestor")]
        constraints = [
            models.CheckConstraint(condition=~models.Q(job=models.F("ancestor")), name="backwave_dependency_not_self"),
            models.CheckConstraint(
                condition=models.Q(on_failure__in=["cancel", "run", "hold"]), name="backwave_dependency_policy_valid"
            ),
        ]

    def __str__(self):
        return f"job {self.job_id} after {self.ancestor_id} ({self.on_failure})"


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


class Overrun(models.Model):
    """A handler still running after its worker ended its attempt (past its time limit, or a
    cancel's grace): the job is ready again or finished, but the handler's thread goes on, and
    it counts against its queue's concurrency limit and its key's per-key limit until it
    returns. Written by the outcome write that ends the attempt, deleted by the worker once the
    handler returns (forget_overruns), and with its lease (expired or released): only a live
    lease's overruns count, so a dead worker holds no key."""

    pk = models.CompositePrimaryKey("job_id", "attempt")
    job_id = models.BigIntegerField()  # no foreign key: a job may be purged while its handler runs on
    attempt = models.IntegerField()
    lease = models.ForeignKey(Lease, on_delete=models.DB_CASCADE, related_name="overruns")
    queue = models.CharField(max_length=64)
    limit_key = models.CharField(max_length=255, null=True, blank=True)
    since = models.DateTimeField(db_default=Now())

    class Meta:
        # The claims count a queue's overruns, and a key's, by this index.
        indexes = [models.Index(fields=["queue", "limit_key"], name="backwave_overrun_queue_key")]

    def __str__(self):
        return f"job {self.job_id} attempt {self.attempt}: its handler still runs"


class AttemptState(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    QUARANTINED = "quarantined", "Quarantined"
    LAPSED = "lapsed", "Lease lapsed"
    CANCELLED = "cancelled", "Cancelled"
    SNOOZED = "snoozed", "Snoozed"  # not a failure: left out of max_attempts (forgiven_attempts)


class Attempt(models.Model):
    """The outcome of one finished attempt of a job."""

    # No index of its own: backwave_attempt_once (job, number) leads with it and serves every
    # lookup by job, the cascade from a deleted job's included (tests/store/test_indexes.py).
    job = models.ForeignKey(Job, on_delete=models.DB_CASCADE, related_name="attempt_log", db_index=False)
    number = models.IntegerField()
    state = models.CharField(max_length=16, choices=AttemptState.choices)
    worker_id = models.CharField(max_length=255)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(db_default=Now())
    # A lapsed attempt's finished_at is when maintenance noticed the lapse, up to a lease
    # duration (and a maintenance interval) after the worker went quiet. The lease's last
    # renewal is the last moment the attempt is known to have been running: the job page shows
    # that as when it ran until.
    lease_renewed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Lapsed attempts: the last renewal of the lease they ran under (they were still running then).",
    )
    error_class = models.CharField(max_length=255, blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    return_value = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        indexes = [
            # The dashboard's recent failures, newest first: only failing attempts write an entry,
            # so a backward scan finds the last few however many successes came since.
            models.Index(
                fields=["id"], name="backwave_attempt_failing", condition=models.Q(state__in=["failed", "quarantined", "lapsed"])
            )
        ]
        constraints = [
            # The Effect-Once fence keeps a late writer out; this makes a double apply impossible
            # even if the fence were ever wrong.
            models.UniqueConstraint(fields=["job", "number"], name="backwave_attempt_once")
        ]

    def __str__(self):
        return f"job {self.job_id} attempt {self.number}: {self.state}"


class PumpStatus(models.TextChoices):
    HEALTHY = health.HEALTHY, "Healthy"
    DEGRADED = health.DEGRADED, "Degraded"  # a transient store fault: it retries on its own
    HALTED = health.HALTED, "Halted"  # fail-stop: an invariant broke; its lease lapses, others take over


class ShownPumpStatus(models.TextChoices):
    """What an operator is shown for a pump: its reported status, unless its lease says otherwise.

    A pump reports its own health, so a killed one keeps reporting "healthy" forever; its lease
    is the truth the database keeps (stamped and expired by the database clock).
    """

    HALTED = PumpStatus.HALTED.value, "Halted"
    LOST = "lost", "Lost"  # not halted, and no live lease: killed, hung or cut off from the database
    STALE = "stale", "Stale"  # a live lease, but the row has not been refreshed for a whole lease
    DEGRADED = PumpStatus.DEGRADED.value, "Degraded"
    HEALTHY = PumpStatus.HEALTHY.value, "Healthy"


# Worst first: the order of the Pumps page and of ``manage.py backwave_health``.
SHOWN_PUMP_ORDER = list(ShownPumpStatus.values)


class PumpQuerySet(models.QuerySet):
    def with_shown_status(self, stale_after: float | None = None) -> "PumpQuerySet":
        """Annotate ``age`` (by the database clock), ``lease_live``, ``shown_status`` (a
        ShownPumpStatus) and ``rank`` (its place in SHOWN_PUMP_ORDER).

        A pump is stale when its heartbeat is older than ``stale_after`` seconds, or than its own
        lease duration when that is None. A halted pump stopped heartbeating on purpose and says
        why: it is never lost or stale.
        """
        live_lease = Lease.objects.filter(worker_id=OuterRef("worker_id"), expires_at__gt=Now())
        limit = Value(stale_after, output_field=models.FloatField()) if stale_after is not None else F("lease_duration")
        shown = Case(
            When(status=PumpStatus.HALTED, then=Value(ShownPumpStatus.HALTED.value)),
            When(lease_live=False, then=Value(ShownPumpStatus.LOST.value)),
            When(age_seconds__gt=limit, then=Value(ShownPumpStatus.STALE.value)),
            default=F("status"),
            output_field=models.CharField(),
        )
        rank = Case(
            *(When(shown_status=status, then=Value(place)) for place, status in enumerate(SHOWN_PUMP_ORDER)),
            output_field=IntegerField(),
        )
        return (
            self.annotate(age=Now() - F("last_heartbeat_at"), lease_live=Exists(live_lease))
            .annotate(
                age_seconds=Func(F("age"), template="EXTRACT(EPOCH FROM %(expressions)s)", output_field=models.FloatField())
            )
            .annotate(shown_status=shown)
            .annotate(rank=rank)
        )


class Pump(models.Model):
    """The health a pump last reported.

    Written by the pump itself when it starts, at each heartbeat and whenever its status changes
    (a halted pump records its reason before its thread ends, and its process keeps the row fresh
    while it lives). A pump that drains cleanly deletes its row; maintenance forgets rows silent
    for longer than ``BACKWAVE["RETENTION"]["pumps"]``.
    """

    worker_id = models.CharField(
        max_length=255, primary_key=True, help_text="Pump identity: host, pid, group, pump number and a nonce."
    )
    group = models.CharField(max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    status = models.CharField(max_length=16, choices=PumpStatus.choices)
    reason = models.TextField(blank=True, default="", help_text="Why the pump is degraded or halted.")
    in_flight = models.IntegerField(default=0, help_text="Jobs claimed and not yet reported.")
    queues = ArrayField(
        models.CharField(max_length=64), default=list, db_default="{}", blank=True, help_text="The queues the pump claims."
    )
    lease_duration = models.FloatField(help_text="Seconds; a heartbeat older than this is stale.")
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat_at = models.DateTimeField(db_default=Now())

    objects = PumpQuerySet.as_manager()

    class Meta:
        ordering = ["group", "worker_id"]

    def __str__(self):
        return f"{self.worker_id} ({self.status})"


class TransitionKind(models.TextChoices):
    """What happened to a job, as observers see it (``backwave.observers``)."""

    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed for good"
    RETRIED = "retried", "Failed, will retry"
    CANCELLED = "cancelled", "Cancelled"
    QUARANTINED = "quarantined", "Quarantined"
    LAPSED = "lapsed", "Lease lapsed"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DEAD = "dead", "Dead (observer kept failing)"


class Transition(models.Model):
    """One applied transition of a job that some observer watches, until every observer of it
    has run: the durable feed of ``backwave.observers``.

    Written by the statement that applies the transition (the fenced outcome write, lease expiry,
    the admin's cancel; the cancels of the dependents these settle, by the same statement), so a
    refused outcome never gets a row and a crash never loses one. The
    observer loop claims due rows with SKIP LOCKED, pushing ``next_attempt_at`` a lease ahead
    (a crashed deliverer's rows come due again then), and deletes a row once every observer of
    it ran; a row whose observer kept failing is left ``dead`` for an operator to retry. No
    foreign key to the job: a transition outlives the retention purge of its job.
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.BigIntegerField()
    attempt = models.IntegerField(help_text="The attempt whose end this is (for a cancel, the job's attempts so far).")
    kind = models.CharField(max_length=16, choices=TransitionKind.choices)
    task_path = models.CharField(max_length=255)
    queue = models.CharField(max_length=64)
    occurred_at = models.DateTimeField(db_default=Now())
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING, db_default=DeliveryState.PENDING
    )
    deliveries = models.IntegerField(default=0, db_default=0, help_text="Delivery attempts so far.")
    next_attempt_at = models.DateTimeField(
        db_default=Now(), help_text="When it is due for delivery; while a deliverer holds it, when that claim lapses."
    )
    claim_token = models.UUIDField(null=True, blank=True)
    delivered_to = ArrayField(
        models.CharField(max_length=255),
        default=list,
        blank=True,
        help_text="Observers that already ran for it (not run again on a retry).",
    )
    # A database default too: a worker of the release before this column notes rows without it.
    observers = ArrayField(
        models.CharField(max_length=255),
        default=list,
        blank=True,
        db_default=Value([], output_field=ArrayField(models.CharField(max_length=255))),
        help_text="The observers it was noted for: only a worker that has one of them registered delivers it (none: any worker).",
    )
    failed_observer = models.CharField(max_length=255, blank=True, default="", db_default="")
    last_error = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["next_attempt_at", "id"], condition=models.Q(state="pending"), name="backwave_transition_due"),
            models.Index(fields=["job_id"], name="backwave_transition_job"),
        ]
        permissions = [("redeliver_transition", "Can retry the delivery of a transition to its observers")]

    def __str__(self):
        return f"job {self.job_id} attempt {self.attempt}: {self.kind}"

    @property
    def waiting_for(self) -> list[str]:
        """The observers it was noted for that have not run for it yet."""
        return [name for name in self.observers if name not in self.delivered_to]


class Deliverer(models.Model):
    """A worker's observer loop and the observers it has registered, as its last claim of
    transitions recorded them (at most every 10 s; forgotten after a day of silence). The
    Transitions page reads it to say which waiting deliveries no live worker can make."""

    id = models.CharField(max_length=255, primary_key=True, help_text="host:pid:database of the observer loop.")
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    observers = ArrayField(models.CharField(max_length=255), default=list, blank=True)
    seen_at = models.DateTimeField(db_default=Now())

    def __str__(self):
        return self.id


class TaskStat(models.Model):
    """One task's finished attempts in one time bucket: counts by outcome and their durations.

    Written only by maintenance's rollup (``roll_up_task_stats`` in store/queries.sql), which
    folds attempts past its watermark into a bucket of each ``resolution`` (a minute and an hour),
    so a page reads at most (tasks x buckets in its range) rows however many jobs ran. Durations
    are kept as a histogram (``duration_histogram``: {bin: count}, bins a quarter of an octave
    wide, see backwave.taskstats), from which percentiles of any range are read back.
    """

    task_path = models.CharField(max_length=255)
    resolution = models.IntegerField(help_text="Bucket width in seconds: 60 or 3600.")
    bucket = models.DateTimeField(help_text="Start of the bucket (by the attempt's finish time).")
    succeeded = models.IntegerField(default=0)
    retried = models.IntegerField(default=0, help_text="Failed attempts after which the job was to run again.")
    failed = models.IntegerField(default=0, help_text="Failed attempts that were their job's last.")
    quarantined = models.IntegerField(default=0)
    lapsed = models.IntegerField(default=0, help_text="Attempts whose worker's lease lapsed under them.")
    cancelled = models.IntegerField(default=0, help_text="Attempts stopped by a cancel.")
    snoozed = models.IntegerField(default=0, help_text="Attempts that asked to run again later (not failures).")
    reruns = models.IntegerField(default=0, help_text="Attempts after the first of their job (retries run).")
    timed = models.IntegerField(default=0, help_text="Attempts with a measured duration (all but lapsed ones).")
    duration_sum = models.FloatField(default=0.0)
    duration_max = models.FloatField(default=0.0)
    duration_histogram = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["resolution", "bucket", "task_path"], name="backwave_task_stat_bucket"),
            models.CheckConstraint(condition=models.Q(resolution__in=[60, 3600]), name="backwave_task_stat_resolution"),
        ]
        db_table = "backwave_task_stat"
        verbose_name = "task statistics"
        verbose_name_plural = "task statistics"

    def __str__(self):
        return f"{self.task_path} @ {self.bucket:%Y-%m-%d %H:%M} ({self.resolution} s)"


class StatsRollup(models.Model):
    """The rollup's watermark: a single row (id 1), locked by the one node rolling up.

    ``watermark`` is the highest attempt id folded into TaskStat. Attempt ids come from a sequence,
    and a transaction may commit a lower id after a higher one is visible, so the rollup only goes
    as far as ``horizon``: the sequence's value at an earlier run, once every transaction that was
    running then (``horizon_xmax``, a transaction id) has ended. See roll_up_task_stats.
    """

    id = models.SmallIntegerField(primary_key=True, default=1)
    watermark = models.BigIntegerField(default=0)
    horizon = models.BigIntegerField(default=0)
    horizon_xmax = models.BigIntegerField(default=0)
    horizon_at = models.DateTimeField(null=True, blank=True, help_text="When the horizon was taken.")
    rolled_up = models.BigIntegerField(default=0, help_text="Attempts folded in since the table was created.")
    rolled_at = models.DateTimeField(null=True, blank=True, help_text="The last rollup run (any node's).")

    class Meta:
        db_table = "backwave_stats_rollup"
        constraints = [models.CheckConstraint(condition=models.Q(id=1), name="backwave_stats_rollup_single_row")]

    def __str__(self):
        return f"statistics rolled up to attempt {self.watermark}"

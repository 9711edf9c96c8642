"""BackWave's ``django.tasks`` backend: enqueue is one INSERT on Django's own connection.

    TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"DATABASE": "default"}}}

Because the INSERT runs on the Django connection of the backend's ``DATABASE`` alias, an enqueue
inside ``transaction.atomic()`` commits or rolls back with the caller's own writes: a worker can
never see a job whose data is not committed yet, and a rolled-back request leaves no job. Workers
serve the database of every backend that declares their groups' queues (``databases.py``).

``task_enqueued`` is sent once the INSERT has run, as Django's own backends do, i.e. before the
caller's transaction commits.

System check ids of this module (the project-wide ones are in ``backwave/checks.py``):

backwave.E101  the backend's ``OPTIONS["DATABASE"]`` is not an alias of ``DATABASES``
backwave.E102  the backend's database is not PostgreSQL
backwave.E103  a name in the backend's ``QUEUES`` is not a valid queue name
backwave.E104  the backend's ``OPTIONS`` has an unknown key (the message suggests the closest one)
backwave.E105  a value in the backend's ``OPTIONS`` has the wrong kind (the message says what is allowed)
backwave.E106  a BackWave backend is configured but ``backwave`` is not in ``INSTALLED_APPS``
backwave.E107  the ``TASKS`` alias is longer than the job table's column holds
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.tasks import TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.inspect import is_module_level_function
from django.utils.module_loading import import_string

from .. import conf
from ..queue_rules import QUEUE_NAME_RULE, is_queue_name
from ..store.contract import NOTHING_OBSERVED, After, DependencyRefused, NewJob
from ..store.enqueue import enqueue_jobs
from ..tracing import enqueue_trace_context
from .payload import encode_payload
from .results import STATUS_BY_STATE, BackWaveTaskResult
from .task import (
    MAX_JOB_ID,
    BackWaveTask,
    TaskCall,
    coerce_calls,
    limit_key,
    unique_key,
    validate_backwave_options,
    validate_django_options,
)

MAX_BACKEND_ALIAS_LENGTH = 64  # Job.backend


class BackWaveBackend(BaseTaskBackend):
    """Jobs in the application's PostgreSQL, claimed by ``manage.py backwave_worker``."""

    task_class = BackWaveTask

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True  # async def tasks run on an event loop per pump

    def __init__(self, alias, params):
        super().__init__(alias, params)
        self.options = self.options or {}
        # Read lazily and validated by check(); a bad value raises ImproperlyConfigured on use.
        self.database = self.options.get("DATABASE", "default") if isinstance(self.options, Mapping) else "default"

    @property
    def _options_where(self) -> str:
        return f"TASKS[{self.alias!r}]['OPTIONS']"

    def _setting(self, name: str):
        options = self.options if isinstance(self.options, Mapping) else None
        return conf.get_setting(name, options, where=self._options_where)

    # --- validation ---------------------------------------------------------------------------

    def validate_task(self, task):
        """Django's checks plus BackWave's (queue name shape, retry options, tags), each error
        naming the option, the value and what is allowed."""
        if not is_module_level_function(task.func):
            raise InvalidTask(
                f"Task function must be defined at a module level. {task.func!r} is not: it is nested, a lambda or a partial."
            )
        validate_django_options(task, queues=self.queues, alias=self.alias)
        super().validate_task(task)
        validate_backwave_options(task)
        self._validate_backoff(task)

    def _validate_backoff(self, task) -> None:
        """A task's backoff cap must not be below its base, either of them possibly the default
        (read only for a task that sets the other: the defaults' own pair is checked on use)."""
        given_base, given_cap = getattr(task, "backoff_base", None), getattr(task, "backoff_max", None)
        if given_base is None and given_cap is None:
            return
        base = given_base if given_base is not None else self._setting("DEFAULT_BACKOFF_BASE")
        cap = given_cap if given_cap is not None else self._setting("DEFAULT_BACKOFF_MAX")
        base_note = "" if given_base is not None else ", DEFAULT_BACKOFF_BASE"
        cap_note = "" if given_cap is not None else ", DEFAULT_BACKOFF_MAX"
        problem = conf.backoff_problem(
            base,
            cap,
            base_label=f"its backoff_base ({base:g} s{base_note})",
            cap_label=f"backoff_max of task {task.module_path!r} ({cap:g} s{cap_note})",
        )
        if problem:
            raise InvalidTask(problem)

    def _defaults(self) -> dict:
        """The enqueue-side settings (this backend's OPTIONS over BACKWAVE over the defaults)."""
        defaults = {name: self._setting(name) for name in conf.BACKEND_OVERRIDABLE}
        options = self.options if isinstance(self.options, Mapping) else None
        if problem := conf.default_backoff_problem(options, self._options_where):
            raise ImproperlyConfigured(problem)
        return defaults

    # --- enqueue ------------------------------------------------------------------------------

    def _new_job(self, task, args, kwargs, defaults: dict, trace_context=None) -> NewJob:
        payload = encode_payload(task, args, kwargs, max_bytes=defaults["MAX_PAYLOAD_BYTES"])
        max_attempts = getattr(task, "max_attempts", None)
        backoff_base = getattr(task, "backoff_base", None)
        backoff_max = getattr(task, "backoff_max", None)
        unique = getattr(task, "unique", None)
        key = unique_key(task, payload["args"], payload["kwargs"])
        return NewJob(
            task_path=task.module_path,
            payload=payload,
            queue=task.queue_name,
            priority=int(task.priority),
            run_at=task.run_after,
            max_attempts=defaults["DEFAULT_MAX_ATTEMPTS"] if max_attempts is None else max_attempts,
            backoff_base=defaults["DEFAULT_BACKOFF_BASE"] if backoff_base is None else backoff_base,
            backoff_max=defaults["DEFAULT_BACKOFF_MAX"] if backoff_max is None else backoff_max,
            backend=self.alias,
            tags=tuple(getattr(task, "tags", ())),
            timeout=getattr(task, "timeout", None),
            trace_context=trace_context,
            limit_key=limit_key(task, payload["args"], payload["kwargs"]),
            unique_key=key,
            unique_period=unique.period if key is not None else None,
            unique_states=unique.states if key is not None else (),
            unique_replace=unique.replace if key is not None else (),
        )

    def build_job(self, task, args, kwargs) -> NewJob:
        """Validate one call as enqueue would and return the row it would insert, inserting
        nothing (how a schedule resolves the job it mints at each slot)."""
        self.validate_task(task)
        return self._new_job(task, args, kwargs, self._defaults())

    def _enqueue_calls(self, calls: Sequence[TaskCall], afters: Sequence[Sequence[After]] | None = None) -> list[TaskResult]:
        """Validate every call, then insert them all with one statement and announce them.
        ``afters``: each call's ancestors (a workflow), checked by that same statement."""
        defaults = self._defaults()
        trace_context = enqueue_trace_context()  # one for the batch: the same caller, the same span
        validated = set()
        jobs = []
        for position, call in enumerate(calls):
            if call.task.backend != self.alias:
                raise InvalidTask(f"Task {call.task.module_path!r} uses backend {call.task.backend!r}, not {self.alias!r}.")
            if id(call.task) not in validated:
                self.validate_task(call.task)
                validated.add(id(call.task))
            job = self._new_job(call.task, call.args, call.kwargs, defaults, trace_context)
            if afters is not None and afters[position]:
                job = replace(job, after=tuple(afters[position]))
            jobs.append(job)
        with connections[self.database].cursor() as cursor:
            try:
                inserted = enqueue_jobs(
                    cursor, jobs, observed=_observed() if any(job.after for job in jobs) else NOTHING_OBSERVED
                )
            except DependencyRefused as refused:
                from .workflow import InvalidDependency

                raise InvalidDependency(str(refused)) from None
        # What the row holds, as the statement returned it (enqueued_at is the database's now()),
        # so the result equals get_result()'s for the same untouched job; a duplicate's state,
        # times and arguments are the existing job's.
        results = []
        for call, job, row in zip(calls, jobs, inserted, strict=True):
            if row.duplicate:
                payload = json.loads(row.payload) if isinstance(row.payload, str) else row.payload
                result = BackWaveTaskResult(
                    task=call.task,
                    id=str(row.id),
                    status=STATUS_BY_STATE[row.state],
                    enqueued_at=row.enqueued_at,
                    started_at=row.started_at,
                    last_attempted_at=row.last_attempted_at,
                    finished_at=row.finished_at,
                    args=payload["args"],
                    kwargs=payload["kwargs"],
                    backend=self.alias,
                    errors=[],
                    worker_ids=[],
                    state=row.state,
                    reason=row.reason,
                    duplicate=True,
                )
            else:
                result = BackWaveTaskResult(
                    task=call.task,
                    id=str(row.id),
                    status=STATUS_BY_STATE[row.state],
                    enqueued_at=row.enqueued_at,
                    started_at=None,
                    last_attempted_at=None,
                    finished_at=None,
                    args=job.payload["args"],
                    kwargs=job.payload["kwargs"],
                    backend=self.alias,
                    errors=[],
                    worker_ids=[],
                    state=row.state,
                )
                # Django's signal means "a job was enqueued": a duplicate enqueued nothing.
                task_enqueued.send(type(self), task_result=result)
            results.append(result)
        return results

    def enqueue(self, task, args, kwargs):
        """Validate, then insert one job with one statement inside the caller's transaction."""
        (result,) = self._enqueue_calls([TaskCall(task, args, kwargs)])
        return result

    def enqueue_many(self, calls: Iterable[TaskCall | tuple]) -> list[TaskResult]:
        """Enqueue ``(task, args, kwargs)`` calls with one INSERT, all validated first; results in
        input order."""
        calls = coerce_calls(calls)
        return self._enqueue_calls(calls) if calls else []

    async def aenqueue_many(self, calls: Iterable[TaskCall | tuple]) -> list[TaskResult]:
        """See enqueue_many()."""
        return await sync_to_async(self.enqueue_many, thread_sensitive=True)(list(calls))

    def enqueue_dependent(self, calls: Sequence[TaskCall], afters: Sequence[Sequence[After]]) -> list[TaskResult]:
        """Enqueue calls that wait for others (``backwave.tasking.workflow``, which has refused
        cycles): one INSERT of the jobs and their dependency rows; nothing is written when an
        ancestor does not exist or already ended badly. Results in input order."""
        if len(afters) != len(calls):
            raise ValueError("enqueue_dependent takes one after list per call")
        return self._enqueue_calls(list(calls), afters) if calls else []

    # --- results ------------------------------------------------------------------------------

    def get_result(self, result_id):
        """The job's TaskResult in one query: the job row, its attempts as an array beside it."""
        from django.contrib.postgres.expressions import ArraySubquery
        from django.db.models import OuterRef
        from django.db.models.functions import JSONObject

        from ..models import Attempt, Job
        from .results import task_result_from_job

        text = str(result_id)
        # Ids are what enqueue hands out: str(job id). Anything else names no job.
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_JOB_ID:
            raise TaskResultDoesNotExist(result_id)
        attempts = (
            Attempt.objects.using(self.database)
            .filter(job=OuterRef("pk"))
            .order_by("number")
            .values(
                row=JSONObject(
                    number="number", state="state", worker_id="worker_id", error_class="error_class", traceback="traceback"
                )
            )
        )
        job = (
            Job.objects.using(self.database)
            .filter(pk=int(text), backend=self.alias)
            .annotate(attempt_rows=ArraySubquery(attempts))
            .first()
        )
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return task_result_from_job(
            job, [Attempt(job_id=job.pk, **row) for row in job.attempt_rows], defaults=self._task_defaults()
        )

    def _task_defaults(self) -> dict | None:
        """The DEFAULT_* values a task's None options stand for, by option name; None when the
        settings are broken (the result is still readable, with the row's values spelled out)."""
        try:
            defaults = self._defaults()
        except ImproperlyConfigured:
            return None
        return {
            "max_attempts": defaults["DEFAULT_MAX_ATTEMPTS"],
            "backoff_base": defaults["DEFAULT_BACKOFF_BASE"],
            "backoff_max": defaults["DEFAULT_BACKOFF_MAX"],
        }

    # --- system checks ------------------------------------------------------------------------

    def check(self, **kwargs):
        """Configuration errors, with stable ids (see the module docstring)."""
        yield from super().check(**kwargs)
        where = self._options_where
        if not apps.is_installed("backwave"):
            yield checks.Error(
                f"{type(self).__name__} is configured as TASKS[{self.alias!r}] but 'backwave' is not in INSTALLED_APPS.",
                hint="Add 'backwave' to INSTALLED_APPS.",
                obj=self.alias,
                id="backwave.E106",
            )
        for problem in conf.options_problems(self.options, where):
            problem_id = "backwave.E104" if "unknown key" in problem else "backwave.E105"
            yield checks.Error(problem, obj=self.alias, id=problem_id)
        if isinstance(self.database, str) and self.database not in settings.DATABASES:
            yield checks.Error(
                f"{where}['DATABASE'] is {self.database!r}, which is not in DATABASES ({', '.join(settings.DATABASES)}).",
                obj=self.alias,
                id="backwave.E101",
            )
        elif (
            isinstance(self.database, str) and _engine_vendor(settings.DATABASES[self.database].get("ENGINE", "")) != "postgresql"
        ):
            yield checks.Error(
                f"BackWave needs PostgreSQL, but database {self.database!r} uses {settings.DATABASES[self.database].get('ENGINE')!r}.",
                hint="Use ENGINE 'django.db.backends.postgresql' (or a backend built on it).",
                obj=self.alias,
                id="backwave.E102",
            )
        for queue in sorted(map(str, self.queues)):
            if not is_queue_name(queue):
                yield checks.Error(
                    f"Queue name {queue!r} in TASKS[{self.alias!r}]['QUEUES'] must be {QUEUE_NAME_RULE}.",
                    obj=self.alias,
                    id="backwave.E103",
                )
        if len(self.alias) > MAX_BACKEND_ALIAS_LENGTH:
            yield checks.Error(
                f"TASKS alias {self.alias!r} is longer than {MAX_BACKEND_ALIAS_LENGTH} characters.",
                obj=self.alias,
                id="backwave.E107",
            )


def _observed() -> str:
    """The transitions this process's observers watch (a dependent cancelled at an enqueue's
    commit notes its transition for them, as a worker's outcome write would)."""
    from ..observers import discovered

    return discovered().observed


def _engine_vendor(engine: str) -> str | None:
    """The vendor of a DATABASES ENGINE (so PostgreSQL-based engines such as PostGIS pass)."""
    try:
        return import_string(f"{engine}.base.DatabaseWrapper").vendor
    except (ImportError, AttributeError):
        return None

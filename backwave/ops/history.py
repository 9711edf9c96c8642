"""Who changed which job: one Django admin ``LogEntry`` per job an operator action changed.

The history lives in ``django.contrib.admin``'s table, so it is written only where the admin is
installed: a project without it (an API-only one) still retries, cancels and purges, from the
commands and from code, and ``backwave.operator``'s log line is then its record. The model is
imported only when it is used: importing it without the admin installed raises RuntimeError.
"""

from __future__ import annotations

from django.apps import apps

from .actions import JobActionResult

HISTORY = {
    # action -> (LogEntry flag's name, what it says)
    "retry": ("CHANGE", "Retried: ready to run now, with one more attempt"),
    "cancel": ("CHANGE", "Cancelled"),
    "purge": ("DELETION", "Purged with its attempts"),
}


def records_history() -> bool:
    """Whether operator actions are recorded in the admin's history (the admin is installed)."""
    return apps.is_installed("django.contrib.admin")


def history_note(database: str) -> str:
    """What an entry adds for a job of ``database``: nothing for the first of the databases the
    console shows (the router's, where entries always pointed), else which one: ids are per
    database."""
    from ..databases import console_databases

    return "" if database == console_databases()[0] else f" in database {database!r}"


def record_history(user, action: str, result: JobActionResult, note: str = "") -> None:
    """One LogEntry per job the action changed, naming who did it and the state it left: the
    job's History page and the admin's "Recent actions" show it. One INSERT per batch; nothing
    without a user or without the admin."""
    if user is None or not result.changed_rows or not records_history():
        return
    from django.contrib.admin import models as admin_models
    from django.contrib.contenttypes.models import ContentType

    from ..models import Job

    content_type = ContentType.objects.get_for_model(Job)
    flag_name, text = HISTORY[action]
    admin_models.LogEntry.objects.bulk_create(
        [
            admin_models.LogEntry(
                user_id=user.pk,
                content_type_id=content_type.pk,
                object_id=str(job_id),
                object_repr=f"{task_path} #{job_id}"[:200],
                action_flag=getattr(admin_models, flag_name),
                change_message=f"{text}{note} (was {state}).",
            )
            for job_id, state, task_path in result.changed_rows
        ]
    )

from django.apps import AppConfig
from django.db.models.signals import pre_migrate


class BackWaveConfig(AppConfig):
    name = "backwave"
    verbose_name = "BackWave"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, connection_checks  # noqa: F401  (registers the system checks)

        pre_migrate.connect(refuse_a_database_backwave_cannot_run_on, sender=self, dispatch_uid="backwave.refuse_database")


def refuse_a_database_backwave_cannot_run_on(sender, using, plan=None, **kwargs):
    """Stop ``migrate`` before it applies anything when BackWave's migrations would run on a
    database that is not PostgreSQL (SQLite, startproject's default): they are PostgreSQL's SQL,
    and would fail half-way with the server's syntax error. The system checks say the same
    (backwave.E102); this holds when they are skipped (``--skip-checks``, ``call_command``)."""
    from django.core.management.base import CommandError
    from django.db import connections, router

    if not any(migration.app_label == sender.label and not backwards for migration, backwards in plan or ()):
        return
    connection = connections[using]
    if connection.vendor == "postgresql" or not router.allow_migrate(using, sender.label):
        return
    raise CommandError(
        f"backwave.E102: BackWave needs PostgreSQL, but database {using!r} uses {connection.settings_dict.get('ENGINE')!r}, "
        "so its migrations cannot run there; nothing was migrated. Use ENGINE 'django.db.backends.postgresql' "
        "(or a backend built on it), or a database router that keeps BackWave's models off this database."
    )

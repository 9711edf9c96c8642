from django.apps import AppConfig


class BackWaveConfig(AppConfig):
    name = "backwave"
    verbose_name = "BackWave"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, connection_checks  # noqa: F401  (registers the system checks)

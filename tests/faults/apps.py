from django.apps import AppConfig


class FaultsConfig(AppConfig):
    """Installed only in worker subprocesses started with BACKWAVE_TEST_FAULTS."""

    name = "tests.faults"
    label = "backwave_test_faults"

    def ready(self):
        from . import hooks

        hooks.install()

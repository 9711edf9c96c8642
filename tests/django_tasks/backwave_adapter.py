"""What the vendored tests use in place of Django's dummy and immediate backends (see README.md).

Not part of Django's files: the one module the adaptation adds.
"""

from asgiref.sync import sync_to_async
from django.conf import settings
from django.tasks import default_task_backend

BACKEND = "backwave.backend.BackWaveBackend"

# Where Django's tests use the immediate backend, a task runs once: a BackWave job that fails is
# retried by default, so those tests give their BackWave backend one attempt per job.
ONE_ATTEMPT = {**settings.BACKWAVE, "DEFAULT_MAX_ATTEMPTS": 1}


def run_tasks():
    """Run every job that is due, as a worker would: BackWave's test pump, on the test's own
    connection (so it sees the jobs enqueued inside the test's transaction)."""
    from backwave.testing import DeterministicPump

    from . import tasks

    pump = DeterministicPump(tasks=[tasks], observers=[])
    try:
        return pump.drain()
    finally:
        pump.close()


arun_tasks = sync_to_async(run_tasks)


def stored_results(backend=None):
    """Every job of ``backend`` (the default one) as its ``get_result()`` gives it, in enqueue
    order: what the dummy backend's ``results`` list holds."""
    from backwave.models import Job

    backend = backend or default_task_backend
    ids = Job.objects.using(backend.database).filter(backend=backend.alias).order_by("pk").values_list("pk", flat=True)
    return [backend.get_result(str(job_id)) for job_id in ids]


astored_results = sync_to_async(stored_results)

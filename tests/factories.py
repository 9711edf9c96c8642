"""factory-boy factories for BackWave's models."""

import factory

from backwave.models import Job, JobState


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

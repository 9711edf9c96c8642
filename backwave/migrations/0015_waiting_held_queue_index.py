"""The Queues page counts the waiting and held jobs of each queue through a partial index of those
rows only, whose second conjunct (queue <> '', which only the overview states) keeps every other
statement from reading it (see the index in models.py). Built CONCURRENTLY, so enqueues and
claims go on meanwhile (not atomic)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("backwave", "0014_schedule_limit_key")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(state__in=["waiting", "held"]) & ~models.Q(queue=""),
                fields=["queue", "state"],
                name="backwave_job_waiting_held",
            ),
        )
    ]

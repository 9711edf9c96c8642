"""GIN indexes for searching jobs by argument value (payload containment) and by tag, and the
last lease renewal of a lapsed attempt (when it was last known to run).

Built CONCURRENTLY, so applying this to a busy job table does not block enqueues or claims while
the indexes build (the migration is therefore not atomic).
"""

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("backwave", "0012_trace_context")]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="lease_renewed_at",
            field=models.DateTimeField(
                blank=True,
                help_text="Lapsed attempts: the last renewal of the lease they ran under (they were still running then).",
                null=True,
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django.contrib.postgres.indexes.GinIndex(
                fields=["payload"],
                name="backwave_job_payload",
                opclasses=["jsonb_path_ops"],
                condition=~models.Q(state="running"),
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django.contrib.postgres.indexes.GinIndex(
                fields=["tags"], name="backwave_job_tags", condition=~models.Q(state="running")
            ),
        ),
    ]

"""The search's GIN indexes get a second conjunct in their predicate that only the search states.

With "NOT state = 'running'" alone, any statement saying "state = 'ready'" (the claims, the
queue latency) could read them as a bitmap over every row, and with statistics from an empty
table (a deploy, a drained queue, a server without autovacuum) the planner did: 10 ms a claim at
20,000 jobs. Rebuilt CONCURRENTLY, so enqueues and claims go on meanwhile (not atomic); the old
index goes first, so for the length of the build the search reads the table instead.
"""

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("backwave", "0006_workflows")]

    operations = [
        RemoveIndexConcurrently(model_name="job", name="backwave_job_payload"),
        RemoveIndexConcurrently(model_name="job", name="backwave_job_tags"),
        AddIndexConcurrently(
            model_name="job",
            index=django.contrib.postgres.indexes.GinIndex(
                condition=~models.Q(state="running") & ~models.Q(payload={}),
                fields=["payload"],
                name="backwave_job_payload",
                opclasses=["jsonb_path_ops"],
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django.contrib.postgres.indexes.GinIndex(
                condition=~models.Q(state="running") & ~models.Q(tags=[]), fields=["tags"], name="backwave_job_tags"
            ),
        ),
    ]

"""Overruns: handlers still running after their worker ended their attempt (a time limit, a
cancel's grace), which count against their queue's and key's limits until they return. Their
lease's foreign key cascades in the database: an expired or released lease takes them along.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("backwave", "0018_attempt_job_index_redundant")]

    operations = [
        migrations.CreateModel(
            name="Overrun",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id", "attempt", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("queue", models.CharField(max_length=64)),
                ("limit_key", models.CharField(blank=True, max_length=255, null=True)),
                ("since", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                (
                    "lease",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.DB_CASCADE, related_name="overruns", to="backwave.lease"
                    ),
                ),
            ],
            options={"indexes": [models.Index(fields=["queue", "limit_key"], name="backwave_overrun_queue_key")]},
        )
    ]

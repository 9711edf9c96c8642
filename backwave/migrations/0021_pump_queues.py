"""Each pump's row lists the queues it claims, so the admin, the metrics and a worker's health
can tell a queue with due jobs that no live pump serves (its jobs would wait for ever) from one
whose worker is merely busy. A row written before this migration lists none until its pump's
next heartbeat rewrites it."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("backwave", "0020_observers_per_delivery")]

    operations = [
        migrations.AddField(
            model_name="pump",
            name="queues",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=64),
                blank=True,
                default=list,
                db_default="{}",
                help_text="The queues the pump claims.",
                size=None,
            ),
        )
    ]

"""A delivery belongs to the observers its transition was noted for (Transition.observers): a
worker claims only the rows waiting for an observer it has registered, so one of an older
release leaves a newer observer's deliveries alone. Deliverer records each observer loop and
what it registered, for the Transitions page. Existing rows name no observer: any worker's; the
column keeps a database default, as workers of the release before it note rows without it.
"""

import django.contrib.postgres.fields
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("backwave", "0019_overruns")]

    operations = [
        migrations.CreateModel(
            name="Deliverer",
            fields=[
                (
                    "id",
                    models.CharField(
                        help_text="host:pid:database of the observer loop.", max_length=255, primary_key=True, serialize=False
                    ),
                ),
                ("hostname", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                (
                    "observers",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.CharField(max_length=255), blank=True, default=list
                    ),
                ),
                ("seen_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.AddField(
            model_name="transition",
            name="observers",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=255),
                blank=True,
                db_default=models.Value(
                    [], output_field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=255))
                ),
                default=list,
                help_text="The observers it was noted for: only a worker that has one of them registered delivers it (none: any worker).",
            ),
        ),
    ]

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("backwave", "0015_waiting_held_queue_index")]

    operations = [
        # A constant default: PostgreSQL adds the column without rewriting the table.
        migrations.AddField(
            model_name="job",
            name="has_dependents",
            field=models.BooleanField(db_default=False, default=False, help_text="Some job waits for this one."),
        ),
        # Jobs that already have dependents (through the ancestor index).
        migrations.RunSQL(
            "UPDATE backwave_job SET has_dependents = true WHERE id IN (SELECT DISTINCT ancestor_id FROM backwave_dependency)",
            migrations.RunSQL.noop,
        ),
    ]

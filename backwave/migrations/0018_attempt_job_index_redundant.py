"""The attempt's job has no index of its own: backwave_attempt_once (job_id, number) leads with it.

Every applied outcome inserts an attempt row, and so an entry into each of the table's indexes;
the single-column index Django makes for a foreign key served no lookup the unique index does not
(the cascade from a deleted job included), so it cost a B-tree insert per job and its pages for
nothing (tests/store/test_indexes.py finds any index another one begins with).

Django's own AlterField would drop the foreign key, the index and add the key back, validating
every attempt row under a lock that stops the workers' writes meanwhile. Only the index goes
here, CONCURRENTLY (outside a transaction, so writes go on), by the name Django gave it (derived
from the table and column, the same on every database); the state records db_index=False.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "backwave_attempt_job_id_7fabbaad"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("backwave", "0017_dependency_keys_not_deferrable")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DB_CASCADE,
                        related_name="attempt_log",
                        to="backwave.job",
                    ),
                )
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{INDEX}" ON "backwave_attempt" ("job_id")',
                )
            ],
        )
    ]

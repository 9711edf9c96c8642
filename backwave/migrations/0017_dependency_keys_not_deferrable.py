"""The two foreign keys of backwave_dependency are checked when the statement that writes an
edge ends, not at the caller's COMMIT.

Django creates every foreign key DEFERRABLE INITIALLY DEFERRED, so each edge's two checks (a
lookup of backwave_job) ran at COMMIT, under whatever planner settings the caller's session had
then. PostgreSQL plans that lookup once per session and keeps the plan; planned while the job
table was a page or two, it is a sequential scan, and a fan-in of 20,000 ran 40,000 of them
over the whole table (50 s). Checked at the end of enqueue_with_dependencies, the lookup is
planned inside that statement, which turns enable_seqscan off for it (queries.sql). Nothing is
lost: the statement writes an edge only to jobs that exist by its end (the ancestors it locked,
or jobs it inserted itself), and ON DELETE CASCADE was never deferred.

Django has no option for this, and rebuilds a foreign key it alters as deferrable again:
tests/store/test_dependencies.py reads the catalog to catch that. The names are Django's (a
hash of the columns), so they are read from the catalog, and anything but the two keys stops
the migration with nothing changed.
"""

from django.db import migrations


def _alter(mode: str) -> str:
    return f"""
DO $$
DECLARE
    keys name[] := ARRAY(
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'backwave_dependency'::regclass AND confrelid = 'backwave_job'::regclass AND contype = 'f'
        ORDER BY conname
    );
    key name;
BEGIN
    IF cardinality(keys) <> 2 THEN
        RAISE EXCEPTION 'backwave_dependency has % foreign keys to backwave_job (%), expected job_id''s and ancestor_id''s',
            cardinality(keys), keys;
    END IF;
    FOREACH key IN ARRAY keys LOOP
        EXECUTE format('ALTER TABLE backwave_dependency ALTER CONSTRAINT %I {mode}', key);
    END LOOP;
END
$$
"""


class Migration(migrations.Migration):
    dependencies = [("backwave", "0016_job_has_dependents")]

    operations = [migrations.RunSQL(_alter("NOT DEFERRABLE"), _alter("DEFERRABLE INITIALLY DEFERRED"))]

"""No index on BackWave's tables is the leading part of another one.

Every index is written on each row it covers: an outcome write inserts one attempt row per job, so
an index the planner never needs (another index starts with the same columns, in the same
operator classes, over the same rows) is a B-tree insert per job for nothing, and pages of it
that VACUUM and the buffer cache carry. Read from the catalog, so an index a migration brings back
is caught whatever it is called (Django names a foreign key's index by a hash of its columns).
"""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# Two indexes over the same rows (neither partial, neither on expressions), the first neither
# unique (a constraint of its own) nor anything but a leading prefix of the second: its columns
# and their operator classes begin the second's. Django's varchar_pattern_ops "_like" indexes
# differ in their operator class and serve LIKE, so they are not counted.
REDUNDANT = """
SELECT a.indexrelid::regclass::text, b.indexrelid::regclass::text
FROM pg_index AS a
JOIN pg_index AS b ON b.indrelid = a.indrelid AND b.indexrelid <> a.indexrelid
JOIN pg_class AS t ON t.oid = a.indrelid
JOIN pg_namespace AS n ON n.oid = t.relnamespace AND n.nspname = current_schema()
WHERE t.relname LIKE 'backwave\\_%%'
  AND a.indpred IS NULL AND b.indpred IS NULL AND a.indexprs IS NULL AND b.indexprs IS NULL
  AND NOT a.indisunique
  AND (SELECT am.amname FROM pg_class AS c JOIN pg_am AS am ON am.oid = c.relam WHERE c.oid = a.indexrelid)
    = (SELECT am.amname FROM pg_class AS c JOIN pg_am AS am ON am.oid = c.relam WHERE c.oid = b.indexrelid)
  AND (b.indkey::text || ' ') LIKE (a.indkey::text || ' %%')
  AND (b.indclass::text || ' ') LIKE (a.indclass::text || ' %%')
ORDER BY 1, 2
"""


def test_no_index_of_backwaves_tables_is_the_leading_part_of_another():
    with connection.cursor() as cursor:
        cursor.execute(REDUNDANT)
        redundant = cursor.fetchall()
    assert redundant == []


def test_the_check_finds_an_index_another_one_begins_with():
    # The check above must be able to fail: an index on the attempt's worker, and one led by it.
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX backwave_attempt_worker ON backwave_attempt (worker_id)")
        cursor.execute("CREATE INDEX backwave_attempt_worker_state ON backwave_attempt (worker_id, state)")
        cursor.execute("CREATE INDEX backwave_attempt_state_worker ON backwave_attempt (state, worker_id)")
        cursor.execute(REDUNDANT)
        found = cursor.fetchall()
    assert ("backwave_attempt_worker", "backwave_attempt_worker_state") in found
    # Led by another column: not redundant.
    assert ("backwave_attempt_worker", "backwave_attempt_state_worker") not in found
    assert not any(covered == "backwave_attempt_worker" for _, covered in found)

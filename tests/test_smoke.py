import pytest
from django.db import connection


@pytest.mark.django_db
def test_database_is_a_real_postgresql():
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version_num')::int")
        assert cursor.fetchone()[0] >= 150000

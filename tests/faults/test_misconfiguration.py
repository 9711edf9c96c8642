"""A worker pointed at a database it can never use halts, says why, and answers 503.

A missing database, an unknown role, a startup option the server rejects: retrying those for
ever would look degraded-but-fine (200) while no job ever runs. Real ``backwave_worker``
processes against the real server; each pump halts (fail-stop) with the server's refusal as its
reason, the process stays up answering 503 until it is signalled, then exits 1.
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from tests.database_urls import database_url

from .conftest import FAST, health_url, http_get, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.parametrize(
    ("env", "server_says"),
    [
        ({"BACKWAVE_TEST_DATABASE_NAME": "backwave_no_such_db"}, 'database "backwave_no_such_db" does not exist'),
        ({"DATABASE_URL": "role"}, 'role "backwave_no_such_role" does not exist'),
        ({"DATABASE_URL": "option"}, 'unrecognized configuration parameter "backwave_no_such_parameter"'),
    ],
    ids=["missing-database", "unknown-role", "rejected-startup-option"],
)
def test_a_worker_on_a_database_it_can_never_use_halts_with_the_reason_and_answers_503(start_worker, env, server_says):
    if env.get("DATABASE_URL") == "role":
        env = {"DATABASE_URL": database_url(connection.settings_dict, user="backwave_no_such_role")}
    elif env.get("DATABASE_URL") == "option":
        env = {"DATABASE_URL": database_url(connection.settings_dict, options="-c backwave_no_such_parameter=1")}
    worker = start_worker("--queues", "faults", "--pumps", "2", "--health-port", "0", *FAST, env=env)
    url = health_url(worker)
    # A halted pump tries to record why before its thread ends: wait for both to be over.
    wait_until(
        lambda: http_get(url)[0] == 503 and not any(p["alive"] for p in http_get(url)[1]["pumps"]),
        what="503, every pump stopped",
        workers=[worker],
    )
    code, body = http_get(url)
    assert body["status"] == "halted" and body["groups"] == {"cli": "halted"}
    assert [p["status"] for p in body["pumps"]] == ["halted", "halted"]
    for pump in body["pumps"]:
        assert pump["reason"].startswith("StoreError: cannot connect to PostgreSQL") and server_says in pump["reason"], pump
    assert worker.process.poll() is None, "fail-stop halts the pumps, the process stays up answering 503"
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 1, worker.output
    assert "Every pump is halted" in worker.output

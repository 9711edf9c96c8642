"""What a worker loads between ``django.setup()`` and its first claim: only what that claim needs.
Each module loaded on the way runs (and, without bytecode compiled beforehand, compiles) before
any job is claimed."""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import faults_env

# Module -> what it is for, which a worker's first claim does not wait for.
NOT_BEFORE_THE_FIRST_CLAIM = {
    "prometheus_client": "the health endpoint's scrape (none here, and a scrape may never come)",
    "croniter": "planning the slots of schedules (the test settings declare none)",
    "backwave.admin.dashboard": "the admin's index and Task statistics pages",
}


@pytest.mark.django_db(transaction=True)
def test_the_first_claim_loads_none_of_what_only_later_work_needs(start_worker, tmp_path):
    loaded_path = tmp_path / "modules.json"
    worker = start_worker(
        "--queues", "e2e", "--no-hints", "--until-idle", env=faults_env(modules_at_first_claim=str(loaded_path))
    )
    assert worker.wait() == 0, worker.output
    loaded = set(json.loads(loaded_path.read_text()))
    # The modules that import them at the top before are there: this is the worker's claim.
    assert {"backwave.shell.pump", "backwave.shell.metrics", "backwave.shell.schedules", "backwave.admin.taskstats"} <= loaded
    assert not set(NOT_BEFORE_THE_FIRST_CLAIM) & loaded, worker.output

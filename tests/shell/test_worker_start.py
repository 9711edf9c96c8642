"""What a worker does between ``django.setup()`` and its first claim: only what that claim needs.
Each module loaded on the way is compiled and run before any job is claimed, and the benchmarks'
first claim (bench/sleepers.py) waits for it."""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import faults_env


@pytest.mark.django_db(transaction=True)
def test_the_first_claim_loads_neither_the_metrics_client_nor_croniter(start_worker, tmp_path):
    """prometheus_client is the health endpoint's scrape (none here, and a scrape may never
    come); croniter plans slots of schedules, and the test settings declare none."""
    loaded_path = tmp_path / "modules.json"
    worker = start_worker("--queues", "e2e", "--no-hints", "--until-idle", env=faults_env(modules_at_first_claim=str(loaded_path)))
    assert worker.wait() == 0, worker.output
    loaded = set(json.loads(loaded_path.read_text()))
    assert {"backwave.shell.pump", "backwave.shell.metrics", "backwave.shell.schedules"} <= loaded  # the pump's own modules are there
    assert not {"prometheus_client", "croniter"} & loaded, worker.output

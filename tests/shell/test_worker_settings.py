"""The worker refuses, before it starts, settings it cannot run on (a group's intervals, the
store's timeouts against the leases), and its stores run under the timeouts of its groups."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from backwave.management.commands.backwave_worker import store_factory_for
from backwave.conf import group_from_mapping
from tests.store.helpers import in_effect

# --until-idle: a worker that wrongly starts finds nothing to do and ends, so the test fails
# instead of waiting.
ONE_OFF = ("--queues", "e2e", "--no-hints", "--until-idle")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("backwave", "args", "message"),
    [
        (
            {"WORKER_STATEMENT_TIMEOUT": 6.0},
            (*ONE_OFF, "--lease-duration", "10"),
            r"^BACKWAVE\['WORKER_STATEMENT_TIMEOUT'\] \(6 s\) must be at most half the lease_duration of Worker Group 'cli' \(10 s\)",
        ),
        (
            {"WORKER_LOCK_TIMEOUT": 3.0},
            (*ONE_OFF, "--lease-duration", "10"),
            r"^BACKWAVE\['WORKER_LOCK_TIMEOUT'\] \(3 s\) must be at most the statement timeout \(2 s\)",
        ),
        (
            {},
            (*ONE_OFF, "--lease-duration", "nan"),
            r"^Worker Group 'cli': lease_duration must be a number of seconds above 0 and at most 604,800 \(a week\), got nan\.$",
        ),
        (
            {},
            (*ONE_OFF, "--poll-interval", "inf"),
            r"^Worker Group 'cli': poll_interval must be a number of seconds above 0 and at most 604,800 \(a week\), got inf\.$",
        ),
        (
            {"WORKER_GROUPS": [{"name": "hb", "queues": ["e2e"], "lease_duration": 3, "heartbeat_interval": 3}]},
            ("--no-hints", "--until-idle"),
            r"^Worker Group 'hb': heartbeat_interval \(3 s\) must be below 90% of lease_duration \(2\.7 of 3 s\)",
        ),
    ],
)
def test_a_setting_the_worker_cannot_run_on_stops_it_before_it_starts(settings, backwave, args, message):
    settings.BACKWAVE = {**settings.BACKWAVE, **backwave}
    with pytest.raises(CommandError, match=message):
        call_command("backwave_worker", *args)


@pytest.mark.django_db(transaction=True)
def test_the_worker_s_stores_run_under_timeouts_from_its_shortest_lease(settings):
    settings.BACKWAVE = {key: value for key, value in settings.BACKWAVE.items() if not key.endswith("_TIMEOUT")}
    groups = [
        group_from_mapping({"name": "long", "lease_duration": 60}),
        group_from_mapping({"name": "short", "lease_duration": 12}),
    ]
    store = store_factory_for(groups)("default")
    try:
        applied = in_effect(store)
    finally:
        store.close()
    assert applied["statement_timeout"][0] == "2400"  # a fifth of 12 s
    assert applied["lock_timeout"][0] == "800"  # a third of that


@pytest.mark.django_db(transaction=True)
def test_the_worker_s_stores_take_the_timeouts_set_in_settings(settings):
    settings.BACKWAVE = {**settings.BACKWAVE, "WORKER_STATEMENT_TIMEOUT": 4, "WORKER_LOCK_TIMEOUT": 0.25}
    store = store_factory_for([group_from_mapping({"name": "g", "lease_duration": 30})])("default")
    try:
        applied = in_effect(store)
    finally:
        store.close()
    assert (applied["statement_timeout"][0], applied["lock_timeout"][0]) == ("4000", "250")


def test_the_worker_runs_backwave_s_checks_at_start_and_not_the_project_s_templates_or_urls():
    """Start-up time: the template and URL checks import every tag library and URLconf (most
    of a worker's time to its first claim), and a worker renders and serves neither."""
    from django.core.checks.registry import registry

    from backwave.management.commands.backwave_worker import Command

    run = {check.__name__ for check in registry.get_checks() if set(check.tags) & set(Command.requires_system_checks)}
    assert {"check_backwave_settings", "check_served_databases", "check_connection_pool", "check_all_models"} <= run
    assert not run & {"check_templates", "check_url_config", "check_url_namespaces_unique"}
    # A misconfigured BACKWAVE setting still stops the worker before it starts.
    assert "check_backwave_settings" in run


@pytest.mark.django_db(transaction=True)
def test_a_plain_worker_runs_the_jobs_of_every_queue_the_backends_declare(settings):
    """No WORKER_GROUPS, no --queues: the quick start's worker, whose task runs on 'emails'."""
    from backwave.models import Job
    from tests.shell.worker_tasks import noop

    settings.BACKWAVE = {key: value for key, value in settings.BACKWAVE.items() if key != "WORKER_GROUPS"}
    queues = ["default", "emails", "e2e", "reports"]
    ids = [int(noop.using(queue_name=queue).enqueue().id) for queue in queues]
    call_command("backwave_worker", "--database", "default", "--no-hints", "--until-idle", "--poll-interval", "0.05")
    assert dict(Job.objects.filter(pk__in=ids).values_list("queue", "state")) == dict.fromkeys(queues, "succeeded")

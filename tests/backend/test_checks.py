"""System checks: stable ids for BACKWAVE (backwave.E00x) and each TASKS backend (backwave.E10x)."""

import pytest
from django.core import checks
from django.tasks import task_backends

from backwave.checks import check_backwave_settings


def backend_check_ids():
    return [message.id for message in task_backends["default"].check()]


def test_the_project_configuration_passes():
    # backwave.W002 is silenced: the tests and the benchmarks run their queues' workers with --queues.
    assert [message for message in checks.run_checks() if message.id.startswith("backwave.") and not message.is_silenced()] == []


def test_backwave_must_be_a_dict(settings):
    settings.BACKWAVE = "nope"
    assert [message.id for message in check_backwave_settings()] == ["backwave.E001"]


def test_unknown_backwave_key_suggests_the_right_one(settings):
    settings.BACKWAVE = {"DEFAULT_MAX_ATTEMPT": 3}
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E002"
    assert "Did you mean 'DEFAULT_MAX_ATTEMPTS'?" in error.msg


def test_bad_backwave_value(settings):
    settings.BACKWAVE = {"MAX_PAYLOAD_BYTES": 0}
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E003"
    assert "BACKWAVE['MAX_PAYLOAD_BYTES'] must be an integer >= 1, got 0" in error.msg


def test_task_modules_must_exist(settings):
    settings.BACKWAVE = {"TASK_MODULES": ["tests.backend.sample_tasks", "tests.backend.no_such_module"]}
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E004"
    assert "'tests.backend.no_such_module'" in error.msg


@pytest.mark.parametrize(
    ("backwave", "message"),
    [
        (
            {"WORKER_GROUPS": [{"name": "g", "lease_duration": 10, "heartbeat_interval": 9.5}]},
            "Worker Group 'g': heartbeat_interval (9.5 s) must be below 90% of lease_duration (9 of 10 s)",
        ),
        (
            {"WORKER_GROUPS": [{"name": "g", "lease_duration": float("nan")}]},
            "Worker Group 'g': lease_duration must be a number of seconds above 0 and at most 604,800 (a week), got nan.",
        ),
        (
            {"WORKER_GROUPS": [{"name": "g", "pool_sise": 4}]},
            "Worker Group 'g' has an unknown option 'pool_sise'. Did you mean 'pool_size'?",
        ),
        ({"WORKER_GROUPS": [{"name": "g"}, {"name": "g"}]}, "Worker Group 'g' is configured twice."),
        (
            {"WORKER_GROUPS": [{"name": "g", "lease_duration": 10}], "WORKER_STATEMENT_TIMEOUT": 6},
            "BACKWAVE['WORKER_STATEMENT_TIMEOUT'] (6 s) must be at most half the lease_duration of Worker Group 'g' (10 s)",
        ),
        # Without WORKER_GROUPS the worker runs one default group, with the default lease (30 s).
        ({"WORKER_STATEMENT_TIMEOUT": 20}, "must be at most half the lease_duration of Worker Group 'default' (30 s)"),
        ({"WORKER_LOCK_TIMEOUT": 7}, "BACKWAVE['WORKER_LOCK_TIMEOUT'] (7 s) must be at most the statement timeout (6 s)"),
    ],
)
def test_worker_groups_and_timeouts_the_worker_cannot_run_on(settings, backwave, message):
    settings.BACKWAVE = backwave
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E006"
    assert message in error.msg


def test_good_worker_groups_and_timeouts_pass(settings):
    settings.BACKWAVE = {
        "WORKER_GROUPS": [{"name": "a", "lease_duration": 60, "heartbeat_interval": 20}, {"name": "b", "lease_duration": 10}],
        "WORKER_STATEMENT_TIMEOUT": 5,
        "WORKER_LOCK_TIMEOUT": 1,
    }
    assert check_backwave_settings() == []


@pytest.mark.parametrize(
    ("backwave", "message"),
    [
        (
            {"DEFAULT_BACKOFF_BASE": 10.0, "DEFAULT_BACKOFF_MAX": 5.0},
            "BACKWAVE['DEFAULT_BACKOFF_MAX'] (5 s) must be at least BACKWAVE['DEFAULT_BACKOFF_BASE'] (10 s)",
        ),
        (
            {"DEFAULT_BACKOFF_MAX": 0.5},
            "BACKWAVE['DEFAULT_BACKOFF_MAX'] (0.5 s) must be at least BACKWAVE['DEFAULT_BACKOFF_BASE'] (1 s, its default)",
        ),
    ],
)
def test_the_default_backoff_cap_must_not_be_below_its_base(settings, backwave, message):
    settings.BACKWAVE = backwave
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E003"
    assert message in error.msg


def with_backend(settings, **changes):
    settings.TASKS = {"default": {**settings.TASKS["default"], **changes}}


def test_backend_passes_as_configured():
    assert backend_check_ids() == []


def test_unknown_database_alias(settings):
    with_backend(settings, OPTIONS={"DATABASE": "replica"})
    assert backend_check_ids() == ["backwave.E101"]


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_database_must_be_postgresql(settings):
    settings.DATABASES = {**settings.DATABASES, "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    with_backend(settings, OPTIONS={"DATABASE": "lite"})
    messages = list(task_backends["default"].check())
    assert [message.id for message in messages] == ["backwave.E102"]
    assert "sqlite3" in messages[0].msg


def test_queue_names_must_be_short_and_plain(settings):
    with_backend(settings, QUEUES=["default", "has space", "x" * 65])
    assert backend_check_ids() == ["backwave.E103", "backwave.E103"]


def test_unknown_option_suggests_the_right_one(settings):
    with_backend(settings, OPTIONS={"DATABSE": "default"})
    messages = list(task_backends["default"].check())
    assert [message.id for message in messages] == ["backwave.E104"]
    assert "Did you mean 'DATABASE'?" in messages[0].msg


@pytest.mark.parametrize("options", [{"MAX_PAYLOAD_BYTES": -1}, {"DEFAULT_MAX_ATTEMPTS": 0}, {"DATABASE": ""}])
def test_bad_option_values(settings, options):
    with_backend(settings, OPTIONS=options)
    assert "backwave.E105" in backend_check_ids()


def test_backend_checks_run_through_djangos_check_framework(settings):
    with_backend(settings, QUEUES=["bad queue"])
    assert "backwave.E103" in [message.id for message in checks.run_checks()]


def test_a_backend_s_backoff_cap_below_the_base_it_inherits(settings):
    with_backend(settings, OPTIONS={"DEFAULT_BACKOFF_MAX": 0.5})
    (error,) = [message for message in task_backends["default"].check() if message.id.startswith("backwave.")]
    assert error.id == "backwave.E105"
    assert error.msg == (
        "TASKS['default']['OPTIONS']['DEFAULT_BACKOFF_MAX'] (0.5 s) must be at least BACKWAVE['DEFAULT_BACKOFF_BASE'] "
        "(1 s, its default): it caps every retry's delay, the first one included."
    )


# ---- backwave.W001: a backend's database that no worker group serves ----------------------------


def test_a_backends_database_no_worker_group_serves_warns(settings):
    from backwave.checks import check_served_databases

    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "local", "queues": ["default", "e2e"]}]}
    (warning,) = check_served_databases()
    assert warning.id == "backwave.W001"
    assert warning.obj == "remote"
    assert (
        "TASKS['remote'] enqueues into database 'other', which no worker group in BACKWAVE['WORKER_GROUPS'] serves" in warning.msg
    )
    assert "'remote'" in warning.hint and "'database': 'other'" in warning.hint


@pytest.mark.parametrize(
    "groups",
    [
        [{"name": "local", "queues": ["default"]}, {"name": "remote", "queues": ["remote"]}],  # its queue maps there
        [{"name": "both", "queues": ["default", "remote"]}],  # one group spanning both databases
        [{"name": "local", "queues": ["default"]}, {"name": "pinned", "queues": ["default"], "database": "other"}],
    ],
)
def test_a_database_some_group_serves_does_not_warn(settings, groups):
    from backwave.checks import check_served_databases

    settings.BACKWAVE = {"WORKER_GROUPS": groups}
    assert check_served_databases() == []


def test_without_worker_groups_a_plain_worker_serves_every_declared_queue_on_its_database(settings):
    """The queue of the 'remote' backend lives in 'other': the implicit group places pumps there too."""
    from backwave import conf
    from backwave.checks import check_served_databases, check_served_queues
    from backwave.databases import place_groups

    settings.BACKWAVE = {}
    placed = place_groups(conf.worker_groups())
    assert {(group.name, group.database) for group in placed} == {("default", "default"), ("default", "other")}
    served = {(group.database, queue) for group in placed for queue in group.policy.queues}
    assert {("default", q) for q in settings.TASKS["default"]["QUEUES"]} | {("other", "remote")} == served
    assert check_served_databases() == [] and check_served_queues() == []


def test_the_implicit_group_shares_its_pumps_between_the_declared_queues_by_equal_weights(settings):
    from backwave import conf
    from backwave.core.policy import Strict, Weighted

    settings.TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend", "QUEUES": ["default", "emails"]}}
    (group,) = conf.worker_groups(conf.implicit_groups())
    assert (group.name, group.policy) == ("default", Weighted({"default": 1, "emails": 1}))
    settings.TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend"}}  # Django's default: ["default"]
    assert conf.worker_groups(conf.implicit_groups())[0].policy == Strict("default")
    settings.TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend", "QUEUES": []}}  # any queue: the tasks' say
    assert conf.worker_groups(conf.implicit_groups({"reports", "emails"}))[0].policy == Weighted({"emails": 1, "reports": 1})


# ---- backwave.W002: a declared queue that no worker group claims ---------------------------------


def test_a_declared_queue_no_worker_group_claims_warns(settings):
    from backwave.checks import check_served_queues

    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "web", "queues": ["default"]}, {"name": "remote", "queues": ["remote"]}]}
    warnings = check_served_queues()
    missing = [q for q in settings.TASKS["default"]["QUEUES"] if q != "default"]
    assert [(w.id, w.obj) for w in warnings] == [("backwave.W002", "default")] * len(missing)
    assert warnings[0].msg == (
        f"Queue {missing[0]!r} of TASKS['default'] is claimed by no worker group in BACKWAVE['WORKER_GROUPS'] on database "
        "'default': its jobs would wait for ever."
    )
    assert "leave WORKER_GROUPS empty" in warnings[0].hint


def test_a_queue_claimed_only_on_another_database_still_warns_for_its_own(settings):
    from backwave.checks import check_served_queues

    every = settings.TASKS["default"]["QUEUES"]
    settings.BACKWAVE = {
        "WORKER_GROUPS": [{"name": "all", "queues": every}, {"name": "pinned", "queues": ["remote"], "database": "default"}]
    }
    # 'remote' lives in 'other', whose backend W001 reports (no group serves that database at all).
    assert [w.id for w in check_served_queues()] == []
    settings.BACKWAVE = {
        "WORKER_GROUPS": [{"name": "all", "queues": every}, {"name": "other", "queues": ["default"], "database": "other"}]
    }
    ((warning),) = check_served_queues()
    assert (warning.id, warning.obj) == ("backwave.W002", "remote") and "on database 'other'" in warning.msg


def test_a_worker_group_on_a_database_the_worker_refuses_is_reported(settings):
    """The worker refuses this group at start (tests/shell/test_databases.py); the check must say so first."""
    settings.BACKWAVE = {"WORKER_GROUPS": [{"name": "pinned", "queues": ["e2e"], "database": "othre"}]}
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E006"
    assert "Worker Group 'pinned': database 'othre' is not in DATABASES (default, other). Did you mean 'other'?" in error.msg


def test_a_schedule_the_worker_would_refuse_is_reported(settings):
    """A task that imports but whose schedule the worker cannot turn into a job (here a queue its
    backend does not declare) stops the worker at start; the check must say so first."""
    settings.BACKWAVE = {
        "TASK_MODULES": ["tests.shell.worker_tasks"],
        "SCHEDULES": {"nightly": {"task": "tests.shell.worker_tasks.noop", "cron": "0 3 * * *", "queue": "undeclared"}},
    }
    (error,) = check_backwave_settings()
    assert error.id == "backwave.E007"
    assert error.msg.startswith("BACKWAVE['SCHEDULES']['nightly']: ")
    assert "'undeclared'" in error.msg

"""Redaction (BACKWAVE["REDACT_KEYS"]), the search's grammar and the traceback reader: pure
functions, no database."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from backwave import conf
from backwave.ops import search as job_search
from backwave.ops import tracebacks
from backwave.ops.redaction import REDACTED, is_sensitive, redact


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "DB_PASSWORD",
        "passwd",
        "client_secret",
        "access_token",
        "api_key",
        "apiKey",
        "API-KEY",
        "Authorization",
        "credentials",
        "private_key",
        "signature",
        "session_id",
        "cookie",
    ],
)
def test_the_default_pattern_hides_the_usual_suspects(key):
    assert is_sensitive(key)


@pytest.mark.parametrize("key", ["order_id", "email", "user", "amount", "to", "keys_count"])
def test_the_default_pattern_leaves_ordinary_keys_alone(key):
    assert not is_sensitive(key)


def test_redact_walks_lists_and_dicts_and_leaves_the_original_alone():
    value = {"args": [{"token": "t1"}, "plain"], "kwargs": {"user": {"name": "ann", "Password": "p"}, "tokens": ["a", "b"]}}
    assert redact(value) == {
        "args": [{"token": REDACTED}, "plain"],
        "kwargs": {"user": {"name": "ann", "Password": REDACTED}, "tokens": REDACTED},
    }
    assert value["kwargs"]["user"]["Password"] == "p"
    assert redact("secret") == "secret" and redact(None) is None


def test_the_setting_replaces_the_pattern_or_turns_redaction_off(settings):
    settings.BACKWAVE = {"REDACT_KEYS": "^pin$"}
    assert redact({"pin": 1, "password": 2}) == {"pin": REDACTED, "password": 2}
    settings.BACKWAVE = {"REDACT_KEYS": None}
    assert redact({"password": 2}) == {"password": 2}


@pytest.mark.parametrize(("value", "message"), [(42, "a regular expression"), ("(unclosed", "not a valid regular expression")])
def test_a_bad_pattern_is_refused_naming_the_setting(settings, value, message):
    settings.BACKWAVE = {"REDACT_KEYS": value}
    with pytest.raises(ImproperlyConfigured, match=message):
        conf.get_setting("REDACT_KEYS")
    assert any("REDACT_KEYS" in problem for problem in conf.settings_problems())


def test_a_log_line_about_a_bad_payload_hides_its_secrets():
    """The quarantine's reason is logged and stored as the attempt's error: no secret in it."""
    from backwave.core.jobs import ClaimedJob
    from backwave.shell.execution import Unroutable, route
    from backwave.tasking.registry import TaskRegistry

    registry = TaskRegistry.discover([])
    job = ClaimedJob(
        id=1,
        task_path=next(iter(registry)),
        queue="default",
        priority=0,
        attempt=1,
        max_attempts=1,
        backoff_base=1.0,
        backoff_max=1.0,
        payload={"args": [], "kwargs": {}, "api_key": "sk-123"},
    )
    with pytest.raises(Unroutable) as raised:
        route(job, registry)
    assert "is not an object with 'args' and 'kwargs'" in str(raised.value)
    assert "'api_key': '********************'" in str(raised.value)
    assert "sk-123" not in str(raised.value)


# --- the search's grammar ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ('a=1 b="x y"', ["a=1", 'b="x y"']),
        ('c={"k": [1, 2]} tag:v', ['c={"k": [1, 2]}', "tag:v"]),
        ("d='it''s'", ["d='it''s'"]),
        ('e="say \\"hi\\" now"', ['e="say \\"hi\\" now"']),
        ("   ", []),
    ],
)
def test_terms_split_on_spaces_outside_quotes_and_brackets(text, terms):
    assert job_search.split_terms(text) == terms


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('a="open', "unbalanced quote"),
        ("=5", "say which argument"),
        ("a..b=1", "say which argument"),
        ("tag:", "needs a tag"),
        ("password=x", "is redacted"),
        ("user.api_key=x", "is redacted"),
        (" ".join(f"t{n}" for n in range(11)), "At most 10"),
    ],
)
def test_a_search_that_cannot_run_says_why(text, message):
    with pytest.raises(job_search.SearchError, match=message):
        job_search.parse(text)


def test_ids_that_no_job_can_have_match_nothing():
    assert job_search.parse("9" * 25).impossible
    assert job_search.parse("#0").impossible
    assert job_search.parse("#42").ids == (42,)


# --- the traceback reader --------------------------------------------------------------------------------


TB = (
    "Traceback (most recent call last):\n"
    '  File "/venv/lib/python3.12/site-packages/backwave/shell/execution.py", line 1, in run\n'
    "    task()\n"
    '  File "/app/shop/tasks.py", line 2, in task\n'
    "    raise ValueError('bad\\nthing')\n"
    "ValueError: bad\n"
    "thing\n"
)


def test_the_message_is_the_last_exception_without_its_class():
    assert tracebacks.error_message("builtins.ValueError", TB) == "bad thing"
    chained = (
        TB
        + "\nThe above exception was the direct cause of the following exception:\n\n"
        + TB.replace("ValueError: bad\nthing", "shop.Oops: it broke")
    )
    assert tracebacks.error_message("shop.Oops", chained) == "it broke"
    assert (
        tracebacks.error_message("backwave.results.LeaseLapsed", "backwave.results.LeaseLapsed: the lease expired")
        == "the lease expired"
    )
    assert (
        tracebacks.error_message(
            "builtins.KeyError", 'Traceback (most recent call last):\n  File "x", line 1, in f\n    d[k]\nKeyError\n'
        )
        == ""
    )
    assert len(tracebacks.error_message("a.B", "a.B: " + "x" * 1000)) == tracebacks.MESSAGE_CHARS


def test_machinery_frames_are_folded_and_counted():
    rendered = tracebacks.render(TB)
    assert rendered.hidden_frames == 1
    assert (
        'class="bw-machinery">  File &quot;/venv/lib/python3.12/site-packages/backwave/shell/execution.py&quot;' in rendered.html
    )
    assert "1 frame of BackWave, Django or asgiref hidden" in rendered.html
    assert "  File &quot;/app/shop/tasks.py&quot;, line 2, in task\n    raise ValueError" in rendered.html
    assert "<script>" not in tracebacks.render("<script>alert(1)</script>").html  # escaped


def test_this_processs_own_package_directories_count_as_machinery():
    import django

    assert tracebacks.is_machinery(django.__file__)
    assert not tracebacks.is_machinery("/app/shop/tasks.py")
    assert not tracebacks.is_machinery("/home/me/backwave_demo/tasks.py")

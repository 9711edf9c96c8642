"""The one list of Django's tests that cannot apply to a database backend such as BackWave, each
with its reason (see README.md). Every other vendored test must pass."""

import importlib

import pytest

NOT_APPLICABLE = {
    "test_custom_backend.py::CustomBackendTestCase::test_backend_does_not_support_priority": (
        "a backend without priority support: BackWave supports priority, and so does a backend built on it"
    ),
    "test_custom_backend.py::CustomBackendTestCase::test_no_enqueue": (
        "a backend without enqueue(): BackWave's backend has one, and so does a backend built on it"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_clear": "the dummy backend's clear() of its in-memory results",
    "test_dummy_backend.py::DummyBackendTestCase::test_get_missing_result": (
        "calls the sync get_result() inside an event loop: a database backend's query raises "
        "SynchronousOnlyOperation there (Django's async-safety guard); aget_result() is what async code calls"
    ),
    "test_tasks.py::TaskTestCase::test_get_missing_result": (
        "calls the sync get_result() inside an event loop (see the dummy backend's test_get_missing_result)"
    ),
    "test_tasks.py::TaskTestCase::test_refresh_result": (
        "calls the sync refresh() inside an event loop, where a database backend's query raises "
        "SynchronousOnlyOperation; arefresh() is what async code calls"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_get_result": (
        "the immediate backend's lack of get_result(): BackWave supports it"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_refresh_result": (
        "the immediate backend's lack of refresh(): BackWave supports it"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_pass_run_after": (
        "the immediate backend's lack of run_after: BackWave supports it"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_throws_keyboard_interrupt": (
        "the immediate backend runs the task inside enqueue(), so a KeyboardInterrupt in the task "
        "reaches the caller; a database backend's enqueue() only writes the job, and a worker runs it"
    ),
}


def pytest_collection_modifyitems(config, items):
    # A name that matches no test (renamed in a newer Django) must not pass unnoticed.
    for node in NOT_APPLICABLE:
        path, cls, method = node.split("::")
        module = importlib.import_module(f"{__package__}.{path.removesuffix('.py')}")
        if not hasattr(getattr(module, cls, None), method):
            raise pytest.UsageError(f"{node!r} is not a test of tests/django_tasks")
    for item in items:
        node = item.nodeid.partition("tests/django_tasks/")[2]
        if node in NOT_APPLICABLE:
            item.add_marker(pytest.mark.skip(reason=f"not applicable to a database backend: {NOT_APPLICABLE[node]}"))

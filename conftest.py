"""The docs' and the README's code blocks as tests (see tests/docs_snippets.py)."""

from tests.docs_snippets import docs_request, pytest_collect_file  # noqa: F401

# The fixtures a project gets from the installed package's pytest plugin (the snippets use them).
pytest_plugins = ["backwave.testing.pytest_plugin"]

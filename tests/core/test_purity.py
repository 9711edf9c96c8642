"""The core does no I/O, reads no clock and draws no randomness: proved on its source and imports."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import backwave.core

CORE_DIR = Path(backwave.core.__file__).parent
CORE_FILES = sorted(CORE_DIR.glob("*.py"))
CORE_MODULES = sorted(f"backwave.core.{m.name}" for m in pkgutil.iter_modules([str(CORE_DIR)]))

# Top-level packages the core must never import, directly or lazily inside a function.
FORBIDDEN_IMPORTS = {
    "django",
    "psycopg",
    "psycopg2",
    "psycopg_pool",
    "threading",
    "_thread",
    "time",
    "random",
    "secrets",
    "os",
    "socket",
    "select",
    "selectors",
    "asyncio",
    "subprocess",
    "multiprocessing",
    "concurrent",
    "queue",
    "signal",
    "logging",
}
# Calls that read a clock or mint randomness, whatever they are imported as.
FORBIDDEN_CALLS = {"now", "utcnow", "today", "uuid1", "uuid4", "monotonic", "perf_counter", "time_ns", "urandom"}


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from datetime import datetime` is fine; `from time import monotonic` is not.
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _called_names(tree: ast.AST) -> list[tuple[int, str]]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                names.append((node.lineno, func.attr))
            elif isinstance(func, ast.Name):
                names.append((node.lineno, func.id))
    return names


def test_the_core_package_has_the_modules_the_tests_expect():
    expected = {"backoff", "commands", "driver", "events", "jobs", "options", "policy"}
    assert expected <= {m.rsplit(".", 1)[1] for m in CORE_MODULES}


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_no_forbidden_import(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    offending = [(line, name) for line, name in _imports(tree) if name.split(".")[0] in FORBIDDEN_IMPORTS]
    assert offending == [], f"{path.name} imports {offending}"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_no_clock_or_randomness_call(path):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    offending = [(line, name) for line, name in _called_names(tree) if name in FORBIDDEN_CALLS]
    assert offending == [], f"{path.name} calls {offending}"
    # Belt and braces, on the text (catches getattr tricks the AST walk would not name).
    for needle in ("uuid4(", "uuid1(", "datetime.now", ".now(", "utcnow(", "monotonic("):
        assert needle not in source, f"{path.name} contains {needle!r}"


def test_uuid_is_used_as_a_type_only():
    """uuid.UUID in annotations is fine: the shell mints lease ids, the core only carries them."""
    for path in CORE_FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "uuid":
                assert node.attr == "UUID", f"{path.name}:{node.lineno} uses uuid.{node.attr}"


def test_the_harness_itself_is_checked():
    """The checks above must be able to fail: a forbidden line is caught by each of them."""
    bad = ast.parse("import time\nfrom threading import Thread\nimport uuid\nx = uuid.uuid4()\ny = datetime.now()\n")
    assert {name.split(".")[0] for _, name in _imports(bad)} & FORBIDDEN_IMPORTS == {"time", "threading"}
    assert {name for _, name in _called_names(bad)} & FORBIDDEN_CALLS == {"uuid4", "now"}


def test_importing_the_core_loads_nothing_forbidden():
    """In a fresh interpreter, importing every core module pulls in no Django, driver or threads.

    ``os`` and ``time`` are loaded by the interpreter itself before any import, so only the AST
    check above can speak for them.
    """
    script = f"""
import json, sys
before = set(sys.modules)
for name in {CORE_MODULES!r}:
    __import__(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=CORE_DIR.parent.parent
    )
    loaded = json.loads(result.stdout)
    assert "backwave.core.driver" in loaded
    forbidden = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN_IMPORTS - {"os", "time"})
    assert forbidden == []

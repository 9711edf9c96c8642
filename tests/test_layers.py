"""The package's layers, checked on the source: no module imports across a forbidden boundary.

Every module under backwave/ is parsed (nothing is imported), and every import in it counts:
top-level, inside a function, under ``TYPE_CHECKING``, relative (resolved against the module's
package), and ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
The rules are data, below, so README.md's layout section can quote them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest

import backwave
from tests.core.test_purity import FORBIDDEN_IMPORTS as CORE_FORBIDDEN_IMPORTS

# The standard library's pure modules: no I/O, no threads, no clock of their own. The core may
# import these and itself, and nothing else.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "numbers",
        "operator",
        "re",
        "string",
        "textwrap",
        "types",
        "typing",
        "uuid",
    }
)


@dataclass(frozen=True)
class Rule:
    """Modules matching ``modules`` (fnmatch patterns on dotted names, ``unless`` excepted) may
    not import what ``forbidden`` names (a package and everything below it), or, when ``only`` is
    given, anything but what it names (a top-level name, or a package and everything below it)."""

    name: str
    modules: tuple[str, ...]
    forbidden: tuple[str, ...] = ()
    only: frozenset[str] | None = None
    unless: tuple[str, ...] = ()

    def covers(self, module: str) -> bool:
        return any(fnmatch(module, p) for p in self.modules) and not any(fnmatch(module, p) for p in self.unless)

    def refuses(self, target: str) -> bool:
        if self.only is not None:
            return not any(target == allowed or target.startswith(f"{allowed}.") for allowed in self.only)
        return any(target == package or target.startswith(f"{package}.") for package in self.forbidden)


RULES = (
    Rule(
        "the core imports only the pure standard library and itself",
        modules=("backwave.core", "backwave.core.*"),
        only=PURE_STDLIB | {"backwave.core"},
    ),
    Rule("the store never imports the shell", modules=("backwave.store", "backwave.store.*"), forbidden=("backwave.shell",)),
    Rule(
        "the Django admin never imports the shell",
        modules=("backwave.admin", "backwave.admin.*", "backwave.admin_*"),
        forbidden=("backwave.shell",),
    ),
    Rule(
        "nothing outside the admin and its template tags imports the admin",
        modules=("backwave", "backwave.*"),
        unless=("backwave.admin", "backwave.admin.*", "backwave.templatetags", "backwave.templatetags.*"),
        forbidden=("backwave.admin",),
    ),
    Rule(
        "ops never imports the admin, the shell or the management commands",
        modules=("backwave.ops", "backwave.ops.*"),
        forbidden=("backwave.admin", "backwave.shell", "backwave.management"),
    ),
    Rule(
        "nothing in production imports backwave.testing",
        modules=("backwave", "backwave.*"),
        unless=("backwave.testing", "backwave.testing.*"),
        forbidden=("backwave.testing",),
    ),
)

PACKAGE_DIR = Path(backwave.__file__).parent


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(module: str, source: str, *, is_package: bool = False) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, what the statement imports from, the names it may load) for every import in ``source``.

    ``from a import b`` may load the module ``a.b`` or only the attribute ``b`` of ``a``: both are
    candidates, so ``from backwave import testing`` counts as importing backwave.testing.
    """
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, (alias.name,)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            origin = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, origin, (origin, *(f"{origin}.{alias.name}" for alias in node.names))))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value, (first.value,)))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id in {"__import__", "import_module"}) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )


def violations(rule: Rule, modules: dict[str, tuple[str, bool]]) -> list[str]:
    """``module:line imports target`` for each import ``rule`` refuses in ``modules``
    ({dotted name: (source, is_package)})."""
    found = []
    for module, (source, is_package) in sorted(modules.items()):
        if not rule.covers(module):
            continue
        for line, origin, targets in imported(module, source, is_package=is_package):
            if rule.only is not None:
                refused = [origin] if rule.refuses(origin) else []  # `from datetime import datetime` is datetime's
            else:
                refused = [target for target in targets if rule.refuses(target)]
            found += [f"{module}:{line} imports {target}" for target in refused[:1]]
    return found


def production_modules() -> dict[str, tuple[str, bool]]:
    return {
        module_name(path): (path.read_text(encoding="utf-8"), path.name == "__init__.py")
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
    }


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_no_module_imports_across_a_forbidden_boundary(rule):
    assert violations(rule, production_modules()) == []


def test_every_rule_covers_modules_that_exist():
    names = set(production_modules())
    assert all(any(rule.covers(name) for name in names) for rule in RULES)


def test_the_core_allowlist_holds_nothing_the_purity_check_forbids():
    assert PURE_STDLIB.isdisjoint(CORE_FORBIDDEN_IMPORTS)


def test_the_harness_itself_is_checked():
    """Each rule catches a line that breaks it, however the import is written."""
    core, store, admin, outside_admin, ops, production = RULES
    modules = {
        "backwave.core.bad": (
            "import time\nfrom collections import deque\nfrom . import events\nfrom backwave import conf\n",
            False,
        ),
        "backwave.core.events": ("from .jobs import ClaimedJob\n", False),
        "backwave.store.bad": ("def later():\n    from ..shell.registry import TaskRegistry\n", False),
        "backwave.admin_stats": ("from backwave import shell\n", False),
        "backwave.admin.pages": ("from backwave.shell import worker\n", False),
        "backwave.admin": ("from .store import params\n", True),
        "backwave.tasking.cancelling": ("def cancel():\n    from ..admin import actions\n", False),
        "backwave.templatetags.backwave_admin": ("from ..admin import charts\n", False),
        "backwave.ops.actions": ("from backwave.shell import pump\nfrom ..management.commands import backwave_jobs\n", False),
        "backwave.ops.stats": ("from ..admin.common import EngineRows\n", False),
        "backwave.tasks.backend": ("import importlib\nTYPE = importlib.import_module('backwave.testing.pump')\n", False),
        "backwave.testing.pump": ("from backwave.testing.clock import VirtualClock\nfrom backwave.shell import pump\n", False),
    }
    assert violations(core, modules) == ["backwave.core.bad:1 imports time", "backwave.core.bad:4 imports backwave"]
    assert violations(store, modules) == ["backwave.store.bad:2 imports backwave.shell.registry"]
    assert violations(admin, modules) == [
        "backwave.admin.pages:1 imports backwave.shell",
        "backwave.admin_stats:1 imports backwave.shell",
    ]
    assert violations(outside_admin, modules) == [
        "backwave.ops.stats:1 imports backwave.admin.common",
        "backwave.tasking.cancelling:2 imports backwave.admin",
    ]
    assert violations(ops, modules) == [
        "backwave.ops.actions:1 imports backwave.shell",
        "backwave.ops.actions:2 imports backwave.management.commands",
        "backwave.ops.stats:1 imports backwave.admin.common",
    ]
    assert violations(production, modules) == ["backwave.tasks.backend:2 imports backwave.testing.pump"]


MOVED = {
    "backwave.admin.actions": "backwave.ops.actions",
    "backwave.admin.stats": "backwave.ops.stats",
    "backwave.admin.tracebacks": "backwave.ops.tracebacks",
    "backwave.job_search": "backwave.ops.search",
    "backwave.redaction": "backwave.ops.redaction",
    "backwave.metrics": "backwave.ops.metrics",
}


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_an_old_import_path_is_the_moved_module_itself(old, new):
    """A user's ``from backwave.admin import actions`` (or a monkeypatch through it) reaches the
    very module the commands and the admin use, for one release."""
    import importlib
    import sys
    import warnings

    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [f"{old} moved to {new}; import it from there"]

"""The public API as a user's editor and type checker see it: every name the facade serves is
listed (``__all__``, ``dir()``), imported for type checkers, and annotated in full.

Importing ``backwave`` stays cheap and Django-free (its names load on first use), so the
facade's ``if TYPE_CHECKING:`` imports are the only place type checkers learn the names from:
a test holds them equal to what ``__getattr__`` serves, so neither can drift.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import backwave
import backwave.testing

ROOT = Path(__file__).resolve().parents[1]

# Named by the API reference (docs/reference/api.md) under a module of their own.
MODULE_NAMES = {
    "backwave.observers": ["observe", "Transition"],
    "backwave.ops.search": ["tags_condition"],
    # The task decorator's options: @task(...) and .using(...) make a BackWaveTask.
    "backwave.tasking.task": ["BackWaveTask"],
}


def public_objects():
    for name in backwave.__all__:
        yield f"backwave.{name}", getattr(backwave, name)
    for name in backwave.testing.__all__:
        yield f"backwave.testing.{name}", getattr(backwave.testing, name)
    for module, names in MODULE_NAMES.items():
        imported = __import__(module, fromlist=names)
        for name in names:
            yield f"{module}.{name}", getattr(imported, name)


def unannotated(qualname: str, function) -> list[str]:
    """What a function's signature leaves without a type: its parameters, then its return."""
    signature = inspect.signature(function)
    missing = [
        f"{qualname}({parameter.name})"
        for position, parameter in enumerate(signature.parameters.values())
        if parameter.annotation is inspect.Parameter.empty and not (position == 0 and parameter.name in {"self", "cls"})
    ]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append(f"{qualname} -> ?")
    return missing


def callables_of(qualname: str, obj):
    """The functions a user calls on a public object: itself, or a class's own constructor and public methods."""
    if not inspect.isclass(obj):
        yield qualname, obj
        return
    for name, member in vars(obj).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            yield f"{qualname}.{name}", member.fget
        elif inspect.isfunction(member):
            yield f"{qualname}.{name}", member


FACADES = [backwave, backwave.testing]


@pytest.mark.parametrize("facade", FACADES, ids=lambda module: module.__name__)
def test_every_name_of_the_facade_resolves_and_is_listed(facade):
    assert facade.__all__ == sorted(facade._EXPORTS)
    for name in facade.__all__:
        assert getattr(facade, name) is not None
    assert set(facade.__all__) <= set(dir(facade))


@pytest.mark.parametrize("facade", FACADES, ids=lambda module: module.__name__)
def test_the_facade_imports_for_type_checkers_exactly_what_it_serves(facade):
    tree = ast.parse(Path(facade.__file__).read_text())
    (guarded,) = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    imported = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        module = f"{facade.__name__}.{node.module}" if node.level else node.module
        for alias in node.names:
            imported[alias.asname or alias.name] = (module, alias.name)
    assert sorted(imported) == facade.__all__
    for name, (module, original) in imported.items():
        assert getattr(facade, name) is getattr(importlib.import_module(module), original), name


def test_importing_the_facade_imports_no_django_model():
    code = "import sys, backwave; dir(backwave); print(sorted(m for m in sys.modules if m.startswith(('django', 'backwave.'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("qualname, obj", list(public_objects()), ids=lambda value: value if isinstance(value, str) else "")
def test_every_public_callable_is_annotated(qualname, obj):
    missing = [gap for name, function in callables_of(qualname, obj) for gap in unannotated(name, function)]
    assert missing == []

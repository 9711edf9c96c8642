"""Every code block of the docs (docs/**/*.md) and the README runs as a test, through Sybil.

The root conftest.py collects them with ``pytest_collect_file`` from here. How each kind of
block is checked:

- ``python``: run, in order, in one namespace per page, against the test database (each block
  is a test item with pytest-django's ``db``). The namespace is a module of its own
  (``docs_snippets_<page>``), registered in ``sys.modules`` and in ``BACKWAVE["TASK_MODULES"]``
  while the page runs, so the tasks a page defines are importable by their path and found by the
  test pump, as an app's ``tasks.py`` is. A block titled as a file (```` ```python
  title="accounts/tasks.py" ````, which the site shows as the block's title and the user's-project
  lane writes into that file) runs as the module ``accounts.tasks``, which later blocks import;
  a second block with the same title adds to it. A function
  named ``test_*`` that a block defines is run at once, its arguments filled with the pytest
  fixtures of those names (``backwave_pump``, ``backwave_jobs``, ``client``...).
- ``python`` blocks that only assign upper-case names (``=`` or ``+=``) are settings fragments:
  they are executed on their own (a ``+=`` adds to the test settings' value) and checked as
  Django and BackWave check settings (a ``BACKWAVE`` dict by
  ``conf.settings_problems`` and the worker's group validation, ``TASKS`` by the backends'
  checks, every other name against Django's global settings).
- ``sh``: each line is checked without running it: ``manage.py`` commands are parsed by their own
  argparse parsers (an unknown command or option fails), ``python -m`` modules must exist, and
  paths into the repository (``bin/run``, ``bench/x.py``) must exist.
- ``toml``, ``yaml``, ``ini`` and ``json`` must parse; ``html`` must compile as a Django template.
- ``text`` blocks are not code (output, a layout tree) and are not collected.

Anything else fails until it gets an evaluator here, or ``<!-- skip: next "why" -->`` before it
(a Dockerfile, a systemd unit): a skip shows in the test report with its reason.
"""

from __future__ import annotations

import ast
import configparser
import copy
import importlib.util
import inspect
import json
import re
import shlex
import sys
import tomllib
import types
import warnings
from pathlib import Path

import pytest
from sybil import Region, Sybil
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
NOT_CODE = {"text"}
TITLE = re.compile(r'title="(?P<title>[^"]+)"')


# --- the page's namespace as a module -----------------------------------------------------------


def _page_module_name(path: str) -> str:
    relative = Path(path).resolve().relative_to(ROOT).with_suffix("")
    return "docs_snippets_" + re.sub(r"\W", "_", str(relative))


def _setup(namespace: dict) -> None:
    from django.test import override_settings

    from backwave import conf

    name = _page_module_name(namespace["__file__"]) if "__file__" in namespace else "docs_snippets_page"
    module = types.ModuleType(name)
    module.__spec__ = importlib.util.spec_from_loader(name, loader=None)
    sys.modules[name] = module
    namespace.update(__name__=name, _docs_module=module, _docs_files=[], _docs_settings=None)
    extra = [*conf.get_setting("TASK_MODULES"), name]
    from django.conf import settings

    overrides = override_settings(BACKWAVE={**getattr(settings, "BACKWAVE", {}), "TASK_MODULES": extra})
    overrides.enable()
    namespace["_docs_settings"] = overrides


def _teardown(namespace: dict) -> None:
    if namespace.get("_docs_settings") is not None:
        namespace["_docs_settings"].disable()
    for name in [namespace.get("__name__"), *namespace.get("_docs_files", ())]:
        sys.modules.pop(name, None)


def _sync(namespace: dict) -> None:
    module = namespace["_docs_module"]
    module.__dict__.update({key: value for key, value in namespace.items() if not key.startswith("_docs_")})


def _file_module(example, dotted: str) -> dict:
    """A fresh module named ``dotted`` (its parent packages too), registered for the page."""
    parts = dotted.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__spec__ = importlib.util.spec_from_loader(name, loader=None, is_package=depth < len(parts))
            if depth < len(parts):
                module.__path__ = []
            sys.modules[name] = module
            example.namespace["_docs_files"].append(name)
            if depth > 1:
                setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], module)
    return sys.modules[dotted].__dict__


# --- python --------------------------------------------------------------------------------------


def _is_settings_fragment(tree: ast.Module) -> bool:
    statements = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    if not statements:
        return False
    for node in statements:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else None
        )
        if not targets or not all(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
            return False
    return True


def _check_settings(values: dict) -> list[str]:
    """What Django and BackWave would say of these settings, beside the test settings."""
    from django.conf import global_settings, settings
    from django.test import override_settings

    problems = []
    for name, value in values.items():
        if name in ("BACKWAVE", "TASKS"):
            continue
        if not hasattr(global_settings, name):
            problems.append(f"{name} is not a Django setting")
            continue
        default = getattr(global_settings, name)
        if default is not None and not isinstance(
            value, (type(default), list, tuple) if isinstance(default, (list, tuple)) else type(default)
        ):
            problems.append(f"{name} should be a {type(default).__name__}, like Django's default, got {type(value).__name__}")
    for app in values.get("INSTALLED_APPS", ()):
        if (
            isinstance(app, str)
            and (app.startswith("django.") or app.startswith("backwave"))
            and importlib.util.find_spec(app.split(".apps.")[0]) is None
        ):
            problems.append(f"INSTALLED_APPS names {app!r}, which cannot be imported")
    for alias, database in values.get("DATABASES", {}).items():
        if "postgresql" not in database.get("ENGINE", ""):
            problems.append(f"DATABASES[{alias!r}] is not PostgreSQL, which BackWave needs")
    overrides = {}
    # Aliases the fragment's own DATABASES declares: a backend naming one is not wrong for it.
    declared = set(values.get("DATABASES", {}))
    if declared - set(settings.DATABASES):
        # Beside the test databases, never connected to here (HINT_DATABASES names them).
        overrides["DATABASES"] = {
            **settings.DATABASES,
            **{k: v for k, v in values["DATABASES"].items() if k not in settings.DATABASES},
        }
    if "BACKWAVE" in values:
        overrides["BACKWAVE"] = values["BACKWAVE"]
    if "TASKS" in values:
        overrides["TASKS"] = values["TASKS"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Overriding setting DATABASES")
        with override_settings(**overrides):
            problems += _backwave_problems(values, declared)
    return problems


def _backwave_problems(values: dict, declared: set) -> list[str]:
    """What BackWave says of the fragment's BACKWAVE and TASKS, with them in the settings."""
    from django.tasks import task_backends

    from backwave import conf

    problems = []
    if "BACKWAVE" in values:
        problems += conf.settings_problems()
        if not problems:
            try:
                conf.worker_groups()
            except ValueError as error:
                problems.append(str(error))
    for alias in values.get("TASKS", {}):
        backend = task_backends.create_connection(alias)
        problems += [
            f"TASKS[{alias!r}]: {error.msg} ({error.id})"
            for error in backend.check()
            if error.is_serious() and not (error.id in ("backwave.E101", "backwave.E102") and backend.database in declared)
        ]
    return problems


def _run_tests(example, before: set) -> None:
    request = example.namespace["docs_request"]
    for name, value in list(example.namespace.items()):
        if name.startswith("test_") and name not in before and inspect.isfunction(value):
            arguments = {parameter: request.getfixturevalue(parameter) for parameter in inspect.signature(value).parameters}
            value(**arguments)


def evaluate_python(example) -> None:
    __tracebackhide__ = True
    source = example.parsed
    padded = "\n" * (example.line + source.line_offset) + source
    tree = ast.parse(padded, example.path)
    if _is_settings_fragment(tree):
        from django.conf import settings

        # A `+=` adds to what the project has: the test settings' value stands for it.
        added = {node.target.id for node in tree.body if isinstance(node, ast.AugAssign)}
        values: dict = {name: copy.deepcopy(getattr(settings, name)) for name in added if hasattr(settings, name)}
        exec(compile(tree, example.path, "exec"), values)
        values = {key: value for key, value in values.items() if key.isupper()}
        problems = _check_settings(values)
        assert not problems, "settings fragment:\n" + "\n".join(problems)
        return
    target_file = example.region.file_module
    namespace = _file_module(example, target_file) if target_file else example.namespace
    before = set(example.namespace)
    exec(compile(tree, example.path, "exec"), namespace)
    namespace.pop("__builtins__", None)
    if not target_file:
        _sync(example.namespace)
        _run_tests(example, before)


# --- shell ---------------------------------------------------------------------------------------


def _check_manage_py(words: list[str]) -> str | None:
    from django.core.management import CommandError, get_commands, load_command_class

    index = next(i for i, word in enumerate(words) if word.endswith("manage.py"))
    if index + 1 >= len(words):
        return None
    name, arguments = words[index + 1], words[index + 2 :]
    commands = get_commands()
    if name not in commands:
        return f"manage.py {name}: no such command"
    app = commands[name]
    command = app if not isinstance(app, str) else load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    try:
        parser.parse_args(arguments)
    except (CommandError, SystemExit) as error:
        return f"manage.py {name} {' '.join(arguments)}: {error}"
    return None


def _check_shell_line(line: str) -> str | None:
    words = shlex.split(line, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]  # VAR=value before the command
    if not words:
        return None
    if any(word.endswith("manage.py") for word in words):
        return _check_manage_py(words)
    if words[0].endswith("python") or words[0].endswith("python3"):
        if len(words) > 2 and words[1] == "-m":
            module = words[2]
            if module not in ("venv", "pip", "compileall", "pytest", "build") and importlib.util.find_spec(module) is None:
                return f"python -m {module}: no such module"
            return None
        if len(words) > 1 and not words[1].startswith("-"):
            words = words[1:]
    first = words[0]
    if first.startswith(("bin/", "bench/", ".ci/")) and not (ROOT / first).exists():
        return f"{first}: no such file in the repository"
    return None


def evaluate_sh(example) -> None:
    problems = []
    for line in str(example.parsed).replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|\|\||;", line):
            if problem := _check_shell_line(part.strip()):
                problems.append(problem)
    assert not problems, "\n".join(problems)


# --- data formats --------------------------------------------------------------------------------


def evaluate_toml(example) -> None:
    tomllib.loads(str(example.parsed))


def evaluate_yaml(example) -> None:
    import yaml

    yaml.safe_load(str(example.parsed))


def evaluate_ini(example) -> None:
    configparser.ConfigParser(interpolation=None).read_string(str(example.parsed))


def evaluate_json(example) -> None:
    json.loads(str(example.parsed))


def evaluate_html(example) -> None:
    from django.template import engines

    engines["django"].from_string(str(example.parsed))


EVALUATORS = {
    "python": evaluate_python,
    "sh": evaluate_sh,
    "toml": evaluate_toml,
    "yaml": evaluate_yaml,
    "ini": evaluate_ini,
    "json": evaluate_json,
    "html": evaluate_html,
}


def _no_evaluator(language: str):
    def evaluate(example):
        raise AssertionError(
            f"a ```{language} block has no evaluator (tests/docs_snippets.py): add one, "
            'or put <!-- skip: next "why it cannot run" --> before it'
        )

    return evaluate


class CodeBlocks:
    """Every fenced block but ``text``, each with its language's evaluator."""

    def __init__(self):
        self.lexer = FencedCodeBlockLexer(language=r".+", mapping={"language": "arguments", "source": "source"})

    def __call__(self, document):
        document.namespace["__file__"] = document.path  # for the page's module name, at setup
        for lexed in self.lexer(document):
            info = lexed.lexemes["arguments"]
            language = info.split()[0]
            if language in NOT_CODE:
                continue
            region = Region(lexed.start, lexed.end, lexed.lexemes["source"], EVALUATORS.get(language) or _no_evaluator(language))
            title = TITLE.search(info)
            path = title["title"] if title else ""
            region.file_module = (
                path.removesuffix(".py").replace("/", ".") if path.endswith(".py") and not path.endswith("settings.py") else None
            )
            yield region


@pytest.fixture
def docs_request(request):
    """The snippet's pytest request: a test function a snippet defines gets its fixtures from it."""
    return request


sybil = Sybil(
    parsers=[CodeBlocks(), SkipParser()],
    patterns=["docs/*.md", "docs/*/*.md"],
    # The tutorial's blocks are a project's files and commands: tests/userproject applies the
    # whole page, as written, to a fresh startproject with the built wheel, and runs it.
    excludes=["docs/tutorial.md"],
    filenames=["README.md"],
    path=str(ROOT),
    setup=_setup,
    teardown=_teardown,
    # Sybil requests only the fixtures named here: pytest-django's test environment (the locmem
    # mail backend, DEBUG off) is autouse for ordinary tests, so it is named too.
    fixtures=["django_test_environment", "db", "docs_request"],
)
pytest_collect_file = sybil.pytest()

"""MkDocs hook: the reference pages' tables, generated from the code when the site is built.

A page holds a marker line such as ``<!-- backwave:settings -->``; the hook replaces it with
Markdown made from the code that the marker names, so the reference cannot drift from it:

- ``settings``: ``backwave.conf.DEFAULTS`` (the one table of ``BACKWAVE`` settings), the backend
  ``OPTIONS``, the worker group options (``WorkerGroupOptions``), ``RETENTION``, ``QUEUES`` and
  ``SCHEDULES`` keys; the text is the code's own comments beside each entry, the allowed values
  are what each validator says of a wrong value;
- ``commands``: every management command's argparse parser, sub-commands included;
- ``checks``: every ``id="backwave.…"`` a check in ``backwave/`` can report, described by the
  id tables in the modules' docstrings (else by the message itself);
- ``schema``: the Django models, field by field, with their indexes and constraints.

It configures Django with a fresh project's minimal settings (no database is opened): the
defaults shown are those a new project gets, not the demo's or the tests'.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import re
import sys
import textwrap
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "backwave"
MARKER = re.compile(r"^<!-- backwave:(\w+) -->$", re.MULTILINE)


# --- Django, configured once ------------------------------------------------------------------


def _django():
    import django
    from django.conf import settings

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=[
                "django.contrib.admin",
                "django.contrib.auth",
                "django.contrib.contenttypes",
                "django.contrib.postgres",
                "backwave",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "app"}},
            TASKS={"default": {"BACKEND": "backwave.backend.BackWaveBackend", "QUEUES": ["default"]}},
            USE_TZ=True,
        )
        django.setup()


# --- comments beside the entries of a literal table -------------------------------------------


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """line number -> (comment text, the line holds nothing but the comment)."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            alone = not token.line[: token.start[1]].strip()
            found[token.start[0]] = (token.string.lstrip("#").strip(), alone)
    return found


def _entry_texts(source: str, entries: list[tuple[str, int, int]], *, runs: bool = False) -> dict[str, str]:
    """The comment of each (name, first line, last line) entry: the comment lines right above
    it, then any comment on its own lines. With ``runs``, an entry with none, right below one
    that has a comment block, shares that block (in DEFAULTS a comment above a run of entries is
    about all of them)."""
    comments = _comments(source)
    texts: dict[str, str] = {}
    previous_block, previous_end = None, None
    for name, first, last in entries:
        block = []
        line = first - 1
        while line in comments and comments[line][1]:
            block.insert(0, comments[line][0])
            line -= 1
        inline = [comments[n][0] for n in range(first, last + 1) if n in comments]
        if runs and not block and not inline and previous_block and previous_end == first - 1:
            block = previous_block
        elif block:
            previous_block = block
        else:
            previous_block = None
        previous_end = last
        texts[name] = " ".join(block + inline)
    return texts


def _dict_entries(tree: ast.Module, variable: str) -> list[tuple[str, int, int]]:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == variable and isinstance(node.value, ast.Dict):
            return [(key.value, key.lineno, value.end_lineno) for key, value in zip(node.value.keys, node.value.values)]
    raise LookupError(f"{variable} is not a dict literal at the top of its module")


def _class_fields(tree: ast.Module, class_name: str) -> list[tuple[str, int, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                (item.target.id, item.lineno, item.end_lineno)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    raise LookupError(f"no class {class_name}")


def _markdown(text: str) -> str:
    """Comment and docstring prose (reST literals) as Markdown."""
    return re.sub(r"``(.+?)``", r"`\1`", text).strip()


def _sentence(text: str) -> str:
    """A comment as a sentence: capitalised, with a full stop."""
    text = _markdown(text)
    if not text:
        return text
    first_word = text.split()[0]
    if "." not in first_word and "_" not in first_word:  # not a dotted name or an identifier
        text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?" else text + "."


def _cell(text: str) -> str:
    return _markdown(text).replace("|", "\\|").replace("\n", " ")


def _literal(value) -> str:
    text = repr(value)
    return f"`{text}`" if "`" not in text else f"``{text}``"


def _anchor(name: str) -> str:
    return name.lower().replace("_", "-")


# --- settings -----------------------------------------------------------------------------------


class _Wrong:
    """A value of no kind any setting accepts: what its validator says of it is the rule."""

    def __repr__(self):
        return "<wrong>"


def _allowed(name: str) -> str:
    from backwave import conf

    try:
        said = conf.VALIDATORS[name](_Wrong())
    except Exception:
        return ""
    said = str(said or "")
    said = re.sub(r"^\[[^\]]*\] (must be )?", "", said)
    said = re.sub(r"[;,] got .*$", "", said).rstrip(".")
    return said


def settings_reference() -> str:
    _django()
    from backwave import conf
    from backwave.core import options

    conf_source = (PACKAGE / "conf.py").read_text()
    conf_tree = ast.parse(conf_source)
    texts = _entry_texts(conf_source, _dict_entries(conf_tree, "DEFAULTS"), runs=True)
    docstring = ast.get_docstring(conf_tree) or ""
    paragraphs = [p for p in docstring.split("\n\n") if p.strip()]

    out = [
        "## `BACKWAVE` settings",
        "",
        f"`settings.BACKWAVE` is a dict; it may set any of these {len(conf.DEFAULTS)} keys (an unknown key is"
        " `backwave.E002`, a value of the wrong kind `backwave.E003`). Values are read on every use, so"
        " `override_settings` takes effect at once.",
        "",
    ]
    for name, default in conf.DEFAULTS.items():
        out += [f"### `{name}` {{#{_anchor(name)}}}", ""]
        out.append(f"Default: {_literal(default)}." + (f" Allowed: {_markdown(_allowed(name))}." if _allowed(name) else ""))
        if name in conf.BACKEND_OVERRIDABLE:
            out.append(
                "A backend's `OPTIONS` may override it for that backend's tasks (see [backend options](#backend-options))."
            )
        out.append("")
        text = texts.get(name, "")
        if text and text.lower() != "see the module docstring":
            out += [_sentence(text.replace("see the module docstring", "").strip(" ;")), ""]
        for paragraph in paragraphs:
            if f"``{name}``" in paragraph:
                out += [_markdown(" ".join(paragraph.split())), ""]

    out += [
        "## Backend options {#backend-options}",
        "",
        "A `TASKS` entry whose `BACKEND` is `backwave.backend.BackWaveBackend` takes Django's `QUEUES`"
        " (the queues its tasks may use; empty: any) and these `OPTIONS`:",
        "",
        "| key | default | allowed |",
        "| --- | --- | --- |",
    ]
    for name in conf.BACKEND_OPTION_NAMES:
        default = conf.BACKEND_OPTION_DEFAULTS.get(name, f"BACKWAVE['{name}']")
        shown = _literal(default) if name in conf.BACKEND_OPTION_DEFAULTS else f"[`BACKWAVE['{name}']`](#{_anchor(name)})"
        out.append(f"| `{name}` | {shown} | {_cell(_allowed(name))} |")
    out.append("")

    options_source = (PACKAGE / "core" / "options.py").read_text()
    options_tree = ast.parse(options_source)
    group_texts = _entry_texts(options_source, _class_fields(options_tree, "WorkerGroupOptions"))
    flag_helps = _worker_flag_helps()
    out += [
        "## Worker group options {#worker-group-options}",
        "",
        "Each entry of [`WORKER_GROUPS`](#worker-groups) is a dict with a `name` and any of these keys"
        " (`WorkerGroupOptions`); a misspelt key or a value out of range stops the worker at start and is"
        " reported by `manage.py check` (`backwave.E006`). `backwave_worker`'s flags override them.",
        "",
        "| key | default | what it is |",
        "| --- | --- | --- |",
        "| `queues` | `['default']` | The queues the group serves, in claim order (a `Strict` policy);"
        " or give `policy`, a dispatch policy object, instead. |",
    ]
    for field in dataclasses.fields(options.WorkerGroupOptions):
        if field.name in ("name", "policy", "retention"):
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        text = group_texts.get(field.name) or flag_helps.get(field.name, "")
        flag = f" (`--{field.name.replace('_', '-')}`)" if field.name in flag_helps else ""
        out.append(f"| `{field.name}`{flag} | {_literal(default)} | {_cell(_sentence(text))} |")
    out.append("")

    retention_texts = _entry_texts(options_source, _class_fields(options_tree, "Retention"))
    retention_doc = " ".join((options.Retention.__doc__ or "").split())
    out += [
        "## `RETENTION` keys {#retention-keys}",
        "",
        _markdown(retention_doc),
        "",
        "| key | default (seconds) | note |",
        "| --- | --- | --- |",
    ]
    for name, default in conf.RETENTION_DEFAULTS.items():
        out.append(f"| `{name}` | {_literal(default)} | {_cell(_sentence(retention_texts.get(name, '')))} |")
    out.append("")

    out += [
        "## `QUEUES` keys {#queues-keys}",
        "",
        "[`QUEUES`](#queues) maps a queue name to a dict of these keys, which every worker writes to the"
        " queue's row at start (see [admission limits](../how-to/admission.md)):",
        "",
        *[f"- `{key}`" for key in conf.QUEUE_KEYS],
        "",
        f"`rate_period` defaults to {conf.DEFAULT_RATE_PERIOD:g} s when a rate limit is set.",
        "",
        "## `SCHEDULES` keys {#schedules-keys}",
        "",
        "[`SCHEDULES`](#schedules) maps a schedule name (1 to"
        f" {conf.MAX_SCHEDULE_NAME_LENGTH} characters) to a dict of these keys (`task` and `cron` required;"
        " see [schedules](../how-to/schedules.md)):",
        "",
        *[f"- `{key}`" for key in conf.SCHEDULE_KEYS],
        "",
    ]
    return "\n".join(out)


# --- management commands ------------------------------------------------------------------------


def _worker_flag_helps() -> dict[str, str]:
    """backwave_worker's help for each flag named after a group option (--pool-size: pool_size)."""
    from django.core.management import load_command_class

    parser = load_command_class("backwave", "backwave_worker").create_parser("manage.py", "backwave_worker")
    formatter = parser._get_formatter()
    helps = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and action.help and action.help is not argparse.SUPPRESS:
                helps[option[2:].replace("-", "_")] = formatter._expand_help(action)
    return helps


# Options every Django command has; listed once, not per command.
_DJANGO_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def _command_names() -> list[str]:
    return sorted(path.stem for path in (PACKAGE / "management" / "commands").glob("backwave_*.py"))


def _parser_table(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.dest in _DJANGO_OPTIONS or isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            name = ", ".join(f"`{option}`" for option in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}` (positional)"
        if action.nargs != 0:
            metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
            if action.choices and not action.metavar:
                metavar = "{" + ",".join(map(str, action.choices)) + "}"
            argument = f"`{metavar}`" if metavar else ""
        else:
            argument = ""
        if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
            argument += " (repeatable)" if isinstance(action, argparse._AppendAction) else f" ({action.nargs})"
        help_text = formatter._expand_help(action) if action.help and action.help is not argparse.SUPPRESS else ""
        default = "" if action.default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 else _literal(action.default)
        rows.append(f"| {name} | {argument.strip()} | {default} | {_cell(help_text)} |")
    if not rows:
        return ["No options of its own.", ""]
    return ["| option | argument | default | what it does |", "| --- | --- | --- | --- |", *rows, ""]


def commands_reference() -> str:
    _django()
    from django.core.management import load_command_class

    out = [
        "Every command also takes Django's common options (`--verbosity`, `--settings`, `--pythonpath`,"
        " `--traceback`, `--no-color`, `--force-color`, `--skip-checks`).",
        "",
    ]
    for name in _command_names():
        command = load_command_class("backwave", name)
        parser = command.create_parser("manage.py", name)
        out += [f"## `{name}` {{#{_anchor(name)}}}", ""]
        module_doc = (sys.modules[type(command).__module__].__doc__ or "").strip()
        summary = command.help or module_doc.split("\n\n")[0]
        out += [_markdown(" ".join(summary.split())), ""]
        out += ["```text", parser.format_usage().strip(), "```", ""]
        out += _parser_table(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for verb, sub in action.choices.items():
                    out += [f"### `{name} {verb}` {{#{_anchor(name)}-{verb}}}", ""]
                    if helps.get(verb):
                        out += [_markdown(helps[verb]), ""]
                    out += _parser_table(sub)
    return "\n".join(out)


# --- system checks ------------------------------------------------------------------------------

_ID = re.compile(r"^backwave\.[EWCI]\d+$")
_ID_LINE = re.compile(r"^(backwave\.[EWCI]\d+)\s+(.*)$")


def _documented_ids(tree: ast.Module) -> dict[str, str]:
    """The id tables of a module's docstring: ``backwave.E001  what it means`` (continued by
    indented lines)."""
    table: dict[str, str] = {}
    current = None
    for line in (ast.get_docstring(tree) or "").splitlines():
        if match := _ID_LINE.match(line):
            current = match.group(1)
            table[current] = match.group(2).strip()
        elif current and line.startswith(" ") and line.strip():
            table[current] += " " + line.strip()
        else:
            current = None
    return table


def _message_text(call: ast.Call) -> str:
    if not call.args:
        return ""
    node = call.args[0]
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "…" for part in node.values)
    return ""


def checks_reference() -> str:
    levels = {"E": "error", "W": "warning", "C": "critical", "I": "info"}
    found: dict[str, tuple[str, str]] = {}
    documented: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text())
        documented.update(_documented_ids(tree))
        for node in ast.walk(tree):
            # An id passed straight to checks.Error (its message beside it), or chosen beforehand.
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "id" and isinstance(keyword.value, ast.Constant) and _ID.match(str(keyword.value.value)):
                        found.setdefault(keyword.value.value, (str(path.relative_to(ROOT)), _message_text(node)))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ID.match(node.value):
                found.setdefault(node.value, (str(path.relative_to(ROOT)), ""))
    for check_id in documented:
        found.setdefault(check_id, ("", ""))
    out = [
        f"BackWave registers its checks under the tag `backwave` (`manage.py check --tag backwave`); {len(found)} ids"
        " in all. Silence one with Django's `SILENCED_SYSTEM_CHECKS`.",
        "",
        "| id | level | what it means | raised in |",
        "| --- | --- | --- | --- |",
    ]
    for check_id in sorted(found, key=lambda text: (text[9], int(re.sub(r"\D", "", text[10:]) or 0))):
        where, message = found[check_id]
        text = documented.get(check_id) or message
        out.append(f"| `{check_id}` | {levels[check_id[9]]} | {_cell(_sentence(text))} | {f'`{where}`' if where else ''} |")
    out.append("")
    return "\n".join(out)


# --- schema -------------------------------------------------------------------------------------


def schema_reference() -> str:
    _django()
    from django.apps import apps
    from django.db import connection

    out = []
    for model in apps.get_app_config("backwave").get_models():
        meta = model._meta
        out += [f"## `{meta.db_table}` {{#{meta.db_table.replace('_', '-')}}}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(f"{model.__name__}("):
            out += [_markdown(" ".join(doc.split("\n\n")[0].split())), ""]
        out += [f"Model `backwave.models.{model.__name__}`.", ""]
        out += ["| column | type | null | default | note |", "| --- | --- | --- | --- | --- |"]
        for field in meta.concrete_fields:
            column_type = field.db_type(connection) or ""
            default = "" if not field.has_default() else _literal(field.default() if callable(field.default) else field.default)
            if getattr(field, "db_default", dataclasses.MISSING) not in (dataclasses.MISSING,) and hasattr(
                field.db_default, "as_sql"
            ):
                default = "database default"
            note = str(field.help_text or "")
            if field.is_relation:
                note = (f"→ `{field.related_model._meta.db_table}`. " + note).strip()
            if field.choices:
                note = (note + " One of " + ", ".join(f"`{value}`" for value, _ in field.choices) + ".").strip()
            out.append(f"| `{field.column}` | `{column_type}` | {'yes' if field.null else ''} | {default} | {_cell(note)} |")
        out.append("")
        named = [
            (index.name, ", ".join(index.fields or [str(e) for e in index.expressions]), getattr(index, "condition", None))
            for index in meta.indexes
        ]
        constraints = [constraint.name for constraint in meta.constraints]
        if named:
            out += ["Indexes declared on the model:", ""]
            out += [
                f"- `{name}` on ({_cell(columns)})" + (f" where `{_cell(str(condition))}`" if condition else "")
                for name, columns, condition in named
            ]
            out.append("")
        if constraints:
            out += ["Constraints: " + ", ".join(f"`{name}`" for name in constraints) + ".", ""]
    return "\n".join(out)


GENERATORS = {
    "settings": settings_reference,
    "commands": commands_reference,
    "checks": checks_reference,
    "schema": schema_reference,
}


def on_page_markdown(markdown, page, config, files, **kwargs):
    def replace(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown marker backwave:{name}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


if __name__ == "__main__":  # print one generated table: python docs/hooks/reference.py settings
    print(textwrap.dedent(GENERATORS[sys.argv[1]]()))

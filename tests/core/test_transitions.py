"""The transition table in core/transitions.py's docstring and the data beside it are one table."""

from __future__ import annotations

import re

import pytest

from backwave.core import commands as cmd
from backwave.core import transitions
from backwave.core import events as ev
from backwave.core.transitions import ACCEPTS, ANSWERS, STALE_TOLERANT, STORE_RESULTS, UNTRACKED, State

EVENT_TYPES = {
    kind.__name__: kind
    for kind in vars(ev).values()
    if isinstance(kind, type) and issubclass(kind, ev.Event) and kind is not ev.Event
}
COMMAND_TYPES = {
    kind.__name__: kind
    for kind in vars(cmd).values()
    if isinstance(kind, type) and issubclass(kind, cmd.Command) and kind is not cmd.Command
}
STATE_WORDS = {"any": set(State), "any*": set(State) - {State.NEW}, **{state.value: {state} for state in State}}
LEADING_NAMES = re.compile(r"^\s*([A-Z]\w*(?:\s*,\s*[A-Z]\w*)*)")


def _rows(doc: str, header: str) -> list[list[str]]:
    """The rows of the ``|`` table whose header line starts with ``header``: each row's cells
    joined over its continuation lines (a line whose first cell is empty continues the row)."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(header))
    rows: list[list[str]] = []
    for line in lines[start + 2 :]:
        if "|" not in line:
            break
        cells = [cell.strip() for cell in line.split("|")]
        if cells[0]:
            rows.append(cells)
        else:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
    return rows


def _names(cell: str, known: dict[str, type]) -> set[type]:
    """The leading comma-separated names of a cell (the rest qualifies them), each one known."""
    match = LEADING_NAMES.match(cell)
    assert match, f"no name leads the cell {cell!r}"
    names = [name.strip() for name in match.group(1).split(",")]
    unknown = [name for name in names if name not in known]
    assert not unknown, f"the table names {unknown}, which do not exist"
    return {known[name] for name in names}


def documented_pairs() -> set[tuple[State, type]]:
    pairs = set()
    for state_cell, event_cell, *_ in _rows(transitions.__doc__, "state "):
        states = set().union(*(STATE_WORDS[word.strip()] for word in state_cell.split(",")))
        pairs |= {(state, kind) for state in states for kind in _names(event_cell, EVENT_TYPES)}
    return pairs


def data_pairs() -> set[tuple[State, type]]:
    return {(state, kind) for state, kinds in ACCEPTS.items() for kind in kinds}


def test_every_pair_the_docstring_shows_is_accepted():
    assert sorted(documented_pairs() - data_pairs(), key=str) == []


def test_every_pair_the_data_accepts_is_in_the_docstring():
    assert sorted(data_pairs() - documented_pairs(), key=str) == []


def test_the_stale_results_the_docstring_shows_are_the_data():
    documented = {}
    for result_cell, answers_cell, *_ in _rows(transitions.__doc__, "result "):
        (result,) = _names(result_cell, EVENT_TYPES)
        (answered,) = _names(answers_cell, COMMAND_TYPES)
        documented[result] = answered
    assert documented == {result: answered for result, answered in ANSWERS.items() if answered in STALE_TOLERANT}
    assert set(documented.values()) == STALE_TOLERANT


def test_the_parser_can_fail():
    """A row naming an event that does not exist, or a pair the data refuses, is caught."""
    bad = "x::\n\n    state | event | what | next\n    ------+-------+------+-----\n    NEW   | Tock  | -    | NEW\n"
    with pytest.raises(AssertionError, match="Tock"):
        _names(_rows(bad, "state ")[0][1], EVENT_TYPES)
    assert (State.NEW, ev.Tick) not in data_pairs()


def test_every_event_is_accepted_somewhere_and_every_store_command_is_answered_or_untracked():
    assert {kind for kinds in ACCEPTS.values() for kind in kinds} == set(EVENT_TYPES.values())
    assert set(ACCEPTS) == set(State)
    store_commands = set(COMMAND_TYPES.values()) - {cmd.ExecuteJob, cmd.StopAttempt}  # the shell's own
    assert set(ANSWERS.values()) == store_commands
    assert UNTRACKED <= store_commands and not UNTRACKED & STALE_TOLERANT
    assert STORE_RESULTS == set(ANSWERS)

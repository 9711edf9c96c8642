"""What PostgreSQL can store of an attempt's report: the checks two walls share.

Whatever a task hands back (a return value, an exception's class and text) must cost that job
alone, never a batch or a pump. Two walls see to it:

* The attempt (``backwave/shell/execution.py``) encodes the return value with ``encode_result``,
  so one PostgreSQL cannot store, or one over ``BACKWAVE["MAX_RESULT_BYTES"]``, fails that
  attempt with ``UnstorableResult`` (retried under the task's normal rules), and it cleans and
  cuts the error texts to what their columns hold (``clean_text``, ``cut_tail``).
* The store's outcome write (``backwave/store/params.py``, shared by every store) re-checks a
  batch whose encoding fails and isolates a row the server refuses, so whatever slips past the
  first wall is written as that one job's failure.

What jsonb and text refuse, and why each check exists: NaN and infinities (JSON has no such
numbers), a NUL character (text cannot hold U+0000, jsonb refuses its escape), a lone surrogate
(not Unicode: jsonb refuses the escape json.dumps writes for it, and UTF-8 cannot encode it), an
int past Python's int-to-text limit (json.dumps raises) or past numeric's 131,072 digits, and any
object JSON does not know. Pure Python: no Django, no database.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any


class UnstorableResult(Exception):
    """A task's return value PostgreSQL cannot store, or one over BACKWAVE['MAX_RESULT_BYTES'].

    The attempt fails with it (retried under the task's normal rules); the message says what was
    wrong and where in the value. It also names the attempts the store itself had to fail because
    their outcome could not be written as it was. ``unsupported_type``: the type JSON has not that
    is at fault, if that is what is wrong (a task's return value then fails with the TypeError
    Django's backends record, see backwave/shell/execution.py).
    """

    def __init__(self, message: str, unsupported_type: type | None = None) -> None:
        super().__init__(message)
        self.unsupported_type = unsupported_type


# Its public name, the one stored as the attempts' error class: backwave.UnstorableResult.
UnstorableResult.__module__ = "backwave"
UNSTORABLE_RESULT = f"{UnstorableResult.__module__}.{UnstorableResult.__qualname__}"

ERROR_CLASS_MAX_CHARS = 255  # backwave_attempt.error_class is varchar(255)
NUMERIC_MAX_DIGITS = 131_072  # PostgreSQL's numeric: digits before the decimal point
TRUNCATED = "…(truncated)\n"

# A surrogate code point not paired up (high then low): no Unicode text holds one. A pair is
# left alone, since json.dumps writes it as the two escapes of one astral character.
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")
_LOG2_10 = math.log2(10)


def encode_result(value: Any, *, max_bytes: int) -> str:
    """The JSON text a return value is stored as, or UnstorableResult saying what is wrong with it."""
    try:
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise UnstorableResult("the return value is nested too deeply to encode as JSON") from None
    except (TypeError, ValueError) as error:
        if "ircular" in str(error):
            raise UnstorableResult("the return value contains itself (a circular reference), which JSON cannot encode") from None
        problem, culprit = _first_problem(value) or (f"the return value cannot be encoded as JSON: {error}", None)
        raise UnstorableResult(problem, culprit) from None
    # A NUL or a lone surrogate reaches the text only as a \u escape (json.dumps escapes all that
    # is not ASCII): without one, the walk is not needed.
    if "\\u" in text and (problem := result_problem(value)):
        raise UnstorableResult(problem)
    if len(text) > max_bytes:  # ensure_ascii: one character is one byte
        raise UnstorableResult(
            f"the return value is {_size(len(text))} of JSON, over BACKWAVE['MAX_RESULT_BYTES'] ({_size(max_bytes)}); "
            "store large results elsewhere (a file, a row) and return their id"
        )
    return text


def result_problem(value: Any) -> str | None:
    """The first thing in ``value`` that PostgreSQL's jsonb cannot store, and where, or None."""
    found = _first_problem(value)
    return found[0] if found else None


def _first_problem(value: Any) -> tuple[str, type | None] | None:
    """result_problem's text, and the type at fault when it is a type JSON has not (else None)."""
    max_digits, digits_limit = _int_limit()
    safe_bits = int((max_digits - 1) * _LOG2_10)  # an int this short has fewer digits than the limit
    seen: set[int] = set()
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if item.bit_length() > safe_bits and (digits := _digits(item)) > max_digits:
                return _where(path, f"an int of {digits:,} digits", f", more than {digits_limit}"), None
        elif isinstance(item, float):
            if math.isnan(item):
                return _where(path, "NaN", ", which JSON cannot represent"), None
            if math.isinf(item):
                return _where(path, "Infinity" if item > 0 else "-Infinity", ", which JSON cannot represent"), None
        elif isinstance(item, str):
            if problem := text_problem(item):
                return _where(path, problem, ", which PostgreSQL cannot store"), None
        elif isinstance(item, (list, tuple, dict)):
            if id(item) in seen:
                continue  # shared, or a cycle (json.dumps reports that one itself)
            seen.add(id(item))
            if isinstance(item, dict):
                children = []
                for key, child in item.items():
                    if isinstance(key, str):
                        if problem := text_problem(key):
                            return _where(path, f"a key holding {problem}", ", which PostgreSQL cannot store", key=True), None
                    elif isinstance(key, float) and not math.isfinite(key):
                        return _where(path, f"the key {key!r}", ", which JSON cannot represent", key=True), None
                    elif key is not None and not isinstance(key, (int, float, bool)):
                        return _where(path, f"a key of type {_type_name(key)}", "; JSON object keys are strings", key=True), type(
                            key
                        )
                    children.append((child, (*path, key)))
                stack.extend(reversed(children))
            else:
                stack.extend((child, (*path, index)) for index, child in reversed(list(enumerate(item))))
        else:
            return _where(path, f"a {_type_name(item)}", ", which is not JSON-serialisable"), type(item)
    return None


def text_problem(text: str) -> str | None:
    """What PostgreSQL's text cannot hold in ``text`` (a NUL, a lone surrogate), or None."""
    if not text.isascii() and (match := _LONE_SURROGATE.search(text)):
        return f"a lone surrogate (U+{ord(match.group()):04X})"
    if "\x00" in text:
        return "a NUL character"
    return None


def clean_text(text: str) -> str:
    """``text`` as a text column can hold it: a NUL or a lone surrogate shown as its escape
    (``\\x00``, ``\\udce9``), so what was there stays visible."""
    if not text.isascii():
        text = _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def ascii_text(text: str) -> str:
    """``text`` with everything outside printable ASCII escaped: what any database encoding holds."""
    return text.encode("ascii", "backslashreplace").decode("ascii").replace("\x00", "\\x00")


def cut_tail(text: str, max_chars: int, marker: str = TRUNCATED) -> str:
    """``text`` in at most ``max_chars`` characters, marker included: its end is kept (where a
    traceback names the exception, where a dotted path names the class)."""
    if len(text) <= max_chars:
        return text
    if max_chars <= len(marker):
        return text[len(text) - max_chars :]
    return marker + text[len(text) - (max_chars - len(marker)) :]


def error_class_text(error_class: str) -> str:
    """An exception's dotted path as backwave_attempt.error_class holds it."""
    return cut_tail(clean_text(error_class), ERROR_CLASS_MAX_CHARS, marker="…")


def _int_limit() -> tuple[int, str]:
    """The most digits an int may have, and what sets that limit."""
    python = sys.get_int_max_str_digits()
    if python and python < NUMERIC_MAX_DIGITS:
        return python, f"Python turns into text (sys.get_int_max_str_digits() is {python:,})"
    return NUMERIC_MAX_DIGITS, f"PostgreSQL's numeric holds ({NUMERIC_MAX_DIGITS:,})"


def _digits(number: int) -> int:
    """Decimal digits of ``number``, without turning it into text (past the limit that raises)."""
    number = abs(number)
    estimate = int(number.bit_length() / _LOG2_10) + 1  # exact, or one too many
    return estimate - 1 if estimate > 1 and number < 10 ** (estimate - 1) else estimate


def _where(path: tuple, what: str, why: str, *, key: bool = False) -> str:
    """Where the problem is, as a sentence; ``key``: ``what`` is a key of the dict at ``path``."""
    if not path:
        return f"the return value {'has' if key else 'is'} {what}{why}"
    where = "".join(f"[{step!r}]" for step in path)
    return f"the return value holds {'a dict with ' if key else ''}{what} at {where}{why}"


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _size(count: int) -> str:
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.1f} MiB"
    if count >= 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count:,} bytes"

"""Reading a stored traceback: the error message it ends with, and its frames split into the
task's own and the machinery's (BackWave's, Django's, asgiref's), which the job page folds away.

The text is what ``traceback.format_exception`` wrote on the worker (cut to its last
``MAX_TRACEBACK_CHARS``), or a one-line reason BackWave wrote itself (a lapsed lease, an
unroutable job). Paths are the worker's, not this process's, so a frame is recognised by where
it sits in an installed tree (``site-packages/django/...``) as well as by this process's own
package directories.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import asgiref
import django
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

import backwave

TRACEBACK_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'  File "(?P<path>[^"]*)", line \d+, in ')
_INSTALLED_MACHINERY = re.compile(r"[/\\](?:site|dist)-packages[/\\](?:django|asgiref|backwave)[/\\]")
_PACKAGE_DIRS = tuple(os.path.dirname(module.__file__) + os.sep for module in (backwave, django, asgiref))
MESSAGE_CHARS = 300


def is_machinery(path: str) -> bool:
    """Whether a frame at ``path`` is BackWave's, Django's or asgiref's rather than the task's."""
    return path.startswith(_PACKAGE_DIRS) or _INSTALLED_MACHINERY.search(path) is not None


def error_message(error_class: str, text: str, limit: int = MESSAGE_CHARS) -> str:
    """The message of the exception a traceback ends with (without its class), on one line."""
    if not text:
        return ""
    lines = text.rstrip("\n").split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK_HEADER)]
    if starts:
        body = lines[starts[-1] + 1 :]
        # Frames and their source lines are indented; the exception's own text is not.
        first = next((i for i, line in enumerate(body) if line and not line[0].isspace()), len(body))
        lines = body[first:]
    message = " ".join(line.strip() for line in lines if line.strip())
    short = error_class.rsplit(".", 1)[-1]
    for prefix in (f"{error_class}:", f"{short}:"):
        if error_class and message.startswith(prefix):
            message = message[len(prefix) :].strip()
            break
    else:
        if error_class and message in (error_class, short):
            message = ""
    return message if len(message) <= limit else message[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class RenderedTraceback:
    html: SafeString
    hidden_frames: int


def render(text: str) -> RenderedTraceback:
    """The traceback as HTML: each machinery frame (its "File" line and the source lines under
    it) in a span the page hides until the operator asks, and a marker where frames are hidden."""
    pieces: list[tuple[str, str]] = []  # (kind, text): "plain", "frame" or "machinery"
    current_kind, current = "plain", []
    for line in text.split("\n"):
        match = _FRAME.match(line)
        if match:
            pieces.append((current_kind, "\n".join(current)))
            current_kind, current = ("machinery" if is_machinery(match["path"]) else "frame"), [line]
        elif current_kind != "plain" and line.startswith("    "):
            current.append(line)
        else:
            if current_kind != "plain":
                pieces.append((current_kind, "\n".join(current)))
                current_kind, current = "plain", []
            current.append(line)
    pieces.append((current_kind, "\n".join(current)))

    parts, hidden, run = [], 0, 0
    for index, (kind, chunk) in enumerate(pieces):
        if not chunk and kind == "plain":
            continue
        if kind == "machinery":
            hidden += 1
            run += 1
            parts.append(format_html('<span class="bw-machinery">{}\n</span>', chunk))
            following = pieces[index + 1][0] if index + 1 < len(pieces) else "plain"
            if following != "machinery":
                parts.append(
                    format_html(
                        '<span class="bw-machinery-note">  … {} frame{} of BackWave, Django or asgiref hidden\n</span>',
                        run,
                        "" if run == 1 else "s",
                    )
                )
                run = 0
        else:
            parts.append(format_html("{}\n", chunk))
    return RenderedTraceback(html=format_html_join("", "{}", ((part,) for part in parts)), hidden_frames=hidden)

"""The tutorial (docs/tutorial.md) as steps the lane applies, in the page's order.

A fenced block with ``title="path"`` is a file: its text goes at the end of that file of the
project, or makes the file when it does not exist yet (what the page tells its reader). A
``sh`` block is commands, one a line; every other block (``text``: output shown) is read only
by people. Nothing of the page is copied into the tests: change the page, and the lane runs
the new text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"

FENCE = re.compile(r"^```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True)
class FileStep:
    path: str
    text: str


@dataclass(frozen=True)
class CommandStep:
    line: str

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line)


def steps(text: str | None = None) -> list[FileStep | CommandStep]:
    """The page's file blocks and command lines, in the order a reader meets them."""
    text = TUTORIAL.read_text() if text is None else text
    found: list[FileStep | CommandStep] = []
    for block in FENCE.finditer(text):
        if title := TITLE.search(block["attrs"]):
            found.append(FileStep(title["title"], block["body"]))
        elif block["lang"] == "sh":
            for line in block["body"].splitlines():
                line = line.split(" #", 1)[0].strip()
                if line and not line.startswith("#"):
                    found.append(CommandStep(line))
    return found


def apply_file(project: Path, step: FileStep) -> Path:
    """Write ``step`` into ``project`` as the page says: appended to an existing file, else created."""
    target = project / step.path
    if target.exists():
        existing = target.read_text()
        target.write_text(existing.rstrip("\n") + "\n\n\n" + step.text)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(step.text)
    return target

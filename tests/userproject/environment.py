"""What the lane's fixtures share: the built distributions, the user's virtualenv, subprocesses."""

from __future__ import annotations

import re
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The distributions the tutorial's `pip install` lines name, besides BackWave itself.
TUTORIAL_INSTALLS = ["pytest-django"]


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path

    def wheel_names(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as archive:
            return archive.namelist()


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def has(self, distribution: str) -> bool:
        code = f"import importlib.metadata as m; m.version({distribution!r})"
        return subprocess.run([self.python, "-c", code], check=False, capture_output=True).returncode == 0


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=False, capture_output=True, text=True, **kwargs)


def pinned_constraints(path: Path) -> Path:
    """requirements.txt's pins as a pip constraints file (constraints take no extras)."""
    lines = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(re.sub(r"\[[^\]]*\]", "", line))
    path.write_text("\n".join(lines) + "\n")
    return path

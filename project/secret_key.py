"""The demo's SECRET_KEY when the environment sets none: generated once per checkout.

Run tokens and sessions are signed with it, so it must never be a default anyone can read in the
source. The first process that needs it writes a fresh key to a file only its owner can read
(``.secret_key`` in the checkout, git-ignored; ``SECRET_KEY_FILE`` moves it); every later process,
the web server's and the worker's alike, reads the same key back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key


def secret_key_from_file(path: str | os.PathLike) -> str:
    """The key kept in ``path``, written there first when the file does not exist yet."""
    path = Path(path)
    try:
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        key = _write_new_key(path)
    if not key:
        raise ImproperlyConfigured(
            f"{path} is empty: delete it to have a new key generated, or set SECRET_KEY in the environment."
        )
    return key


def _write_new_key(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole beside the target (mkstemp: mode 0600) and hard-linked into place, which fails
    # if the file exists: two processes starting at once never see half a key, and one key wins.
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".new")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(get_random_secret_key() + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process won: use its key
    finally:
        os.unlink(temporary)
    return path.read_text(encoding="utf-8").strip()

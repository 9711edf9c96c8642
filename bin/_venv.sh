# Sourced by bin/run and bin/test: go to the repository root and make sure the virtualenv exists
# with requirements.txt installed, then put it first on PATH.
#
#   VENV      the virtualenv's folder (default .venv, relative to the repository root)
#   PYTHON    the interpreter that creates it (default: the first of python3.12, python3.13,
#             python3.14, python3 that is Python 3.12 or newer)
#
# requirements.txt is installed again only when it changed: its sha256 is stamped in
# $VENV/.requirements.sha after a successful install.

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}

_backwave_is_312() {
    # pyenv shims exist for versions that are not selected, so run the interpreter: a shim that
    # cannot serve fails here instead of later.
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

_backwave_find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3.12 python3.13 python3.14 python3; do
        if command -v "$candidate" >/dev/null 2>&1 && _backwave_is_312 "$candidate"; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if [ ! -x "$VENV/bin/python" ] || ! _backwave_is_312 "$VENV/bin/python"; then
    if ! _backwave_python=$(_backwave_find_python); then
        echo "BackWave needs Python 3.12 or newer: install it (python3.12 on PATH), or set PYTHON=/path/to/python3.12" >&2
        exit 1
    fi
    echo "Creating the virtualenv $VENV with $("$_backwave_python" --version 2>&1)" >&2
    "$_backwave_python" -m venv --clear "$VENV"
fi

_backwave_sha=$("$VENV/bin/python" -c 'import hashlib; print(hashlib.sha256(open("requirements.txt", "rb").read()).hexdigest())')
if [ "$(cat "$VENV/.requirements.sha" 2>/dev/null)" != "$_backwave_sha" ]; then
    echo "Installing requirements.txt into $VENV" >&2
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet -r requirements.txt
    echo "$_backwave_sha" >"$VENV/.requirements.sha"
fi

VIRTUAL_ENV=$(cd "$VENV" && pwd)
export VIRTUAL_ENV
export PATH="$VIRTUAL_ENV/bin:$PATH"
unset _backwave_python _backwave_sha

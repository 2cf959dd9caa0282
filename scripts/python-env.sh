#!/usr/bin/env bash
# Creates the project's Python virtualenv (.venv), installs the pinned tools
# and libraries the Python tests use (crates/py/requirements-dev.txt), and
# builds and installs the `nodekernel` package into it (maturin develop:
# the Rust extension plus the pure-Python package, editable).
#   scripts/python-env.sh [--release]
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "python-env: $PY not found; install CPython >= 3.9" >&2
    exit 1
fi
if [[ ! -x .venv/bin/python ]]; then
    echo "== creating .venv =="
    "$PY" -m venv .venv
fi
REQ=crates/py/requirements-dev.txt
STAMP=.venv/.requirements.sha256
if ! sha256sum --status -c "$STAMP" 2>/dev/null; then
    echo "== installing Python test dependencies ($REQ) =="
    .venv/bin/python -m pip install --quiet -r "$REQ"
    sha256sum "$REQ" >"$STAMP"
fi
echo "== building the nodekernel Python package (maturin develop $*) =="
(cd crates/py && VIRTUAL_ENV="$PWD/../../.venv" PATH="$PWD/../../.venv/bin:$PATH" \
    maturin develop --quiet "$@")
.venv/bin/python -c "import nodekernel, fsspec; fsspec.filesystem('nk'); print('nodekernel', nodekernel.__file__)"

#!/usr/bin/env bash
# Creates the project's Python virtualenv (.venv), installs the pinned tools
# and libraries the Python tests use (crates/py/requirements-dev.txt), and
# builds and installs the `nodekernel` package into it (maturin develop:
# the Rust extension plus the pure-Python package, editable).
#   scripts/python-env.sh [--release]
#   scripts/python-env.sh --module FILE
# With --module, FILE is the extension module that `cargo test` already
# built (target/debug/deps/lib_native.so, see crates/py/tests/module.rs):
# it is installed as it is, with the package metadata maturin writes from
# pyproject.toml, instead of compiling the binding a second time with
# other features (in scripts/test.sh's clean runs the Python step went from
# 224–262 s to 147–178 s).
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
VENV_BIN="$PWD/.venv/bin"
REQ=crates/py/requirements-dev.txt
STAMP=.venv/.requirements.sha256
if ! sha256sum --status -c "$STAMP" 2>/dev/null; then
    echo "== installing Python test dependencies ($REQ) =="
    .venv/bin/python -m pip install --quiet -r "$REQ"
    sha256sum "$REQ" >"$STAMP"
fi
# An editable install as maturin develop makes it (PEP 660's .pth form):
# the dist-info maturin writes from pyproject.toml, a .pth naming the
# package's source folder, and the module copied into that folder.
install_module() {
    local module=$1 site dist
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$site"/nodekernel-*.dist-info "$site/nodekernel.pth"
    local out
    out=$(cd crates/py && PATH="$VENV_BIN:$PATH" \
        maturin pep517 write-dist-info --metadata-directory "$site" 2>&1) ||
        { echo "$out" >&2; return 1; }
    dist=$(echo "$site"/nodekernel-*.dist-info)
    echo "$PWD/crates/py/python" >"$site/nodekernel.pth"
    echo "scripts/python-env.sh" >"$dist/INSTALLER"
    printf '{"dir_info": {"editable": true}, "url": "file://%s/crates/py"}\n' "$PWD" \
        >"$dist/direct_url.json"
    (cd "$site" && for f in nodekernel.pth "${dist#"$site"/}"/*; do echo "$f,,"; done \
        >"$dist/RECORD")
    cp "$module" crates/py/python/nodekernel/_native.abi3.so
}
if [[ ${1:-} == --module ]]; then
    if [[ $# -ne 2 || ! -f $2 ]]; then
        echo "python-env: --module needs the built extension module (${2:-none given})" >&2
        exit 2
    fi
    echo "== installing the nodekernel Python package with the module $2 =="
    install_module "$2"
else
    echo "== building the nodekernel Python package (maturin develop $*) =="
    (cd crates/py && VIRTUAL_ENV="$PWD/../../.venv" PATH="$VENV_BIN:$PATH" \
        maturin develop --quiet "$@")
fi
.venv/bin/python -c "import nodekernel, fsspec; fsspec.filesystem('nk'); print('nodekernel', nodekernel.__file__)"

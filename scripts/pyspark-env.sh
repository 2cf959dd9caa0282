#!/usr/bin/env bash
# Creates .venv-pyspark for the PySpark test (java/nodekernel-spark/pyspark,
# the test command's heavy tier): the `pyspark` wheel from PyPI, with the
# Spark it bundles (3.5, Scala 2.12: what `pip install pyspark` gives a
# user), and pytest; pinned in java/nodekernel-spark/pyspark/requirements.txt.
# A virtualenv of its own, not .venv: the wheel is about 317 MB and only
# the heavy tier needs it. pip keeps the download in its cache (~/.cache/pip),
# so a new venv installs without fetching it again; a stamp skips pip when
# the pins have not changed.
#   scripts/pyspark-env.sh      prints the venv's python at the end
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv-pyspark
REQ=java/nodekernel-spark/pyspark/requirements.txt
STAMP=$VENV/.requirements.sha256
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "pyspark-env: $PY not found; install CPython >= 3.9" >&2
    exit 1
fi
if [[ ! -x $VENV/bin/python ]]; then
    echo "== creating $VENV ==" >&2
    "$PY" -m venv "$VENV"
fi
if ! sha256sum --status -c "$STAMP" 2>/dev/null; then
    echo "== installing $REQ into $VENV ==" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
    sha256sum "$REQ" >"$STAMP"
fi
"$VENV/bin/python" -c 'import pyspark; print("pyspark", pyspark.__version__, pyspark.__file__)' >&2
echo "$PWD/$VENV/bin/python"

#!/usr/bin/env bash
# Python client benchmark (issue #11): key/value latency against redis-py and
# fsspec sequential bandwidth against /dev/shm, in one run.
#
#   scripts/bench-python.sh --out results.jsonl [bench_python.py options]
#
# Starts its own cluster (`nk up`, 4 GiB of DRAM, no file tier) and its own
# Redis server on free ports, stops both at exit, and runs
# scripts/bench_python.py with a release build of the `nodekernel` module
# installed in a separate virtualenv (BENCH_VENV, default target/bench-venv;
# the project's .venv keeps its test build). Prints Markdown tables; the JSON
# lines go to --out.
#
# Environment:
#   BENCH_VENV=DIR  the benchmark's virtualenv (made if missing)
#   NO_BUILD=1      use the nk binary and the module installed already
#   QUICK=1         a smoke run (a tenth of the operations, a 256 MiB file)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BENCH_NAME=bench-python
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
bench_prepare
SHM=$(mktemp -d /dev/shm/bench-python.XXXXXX)
CLEANUP_PATHS+=("$SHM")

echo "== starting nk up and redis-server ==" >&2
bench_start_nk 4GiB
bench_start_redis
echo "== cluster at $META, redis at 127.0.0.1:$REDIS_PORT ==" >&2

# NumPy (the aligned buffers of the readinto rows) loads OpenBLAS, whose
# idle worker threads would only add noise on a 2-core machine.
export OPENBLAS_NUM_THREADS=1
EXTRA=()
if [[ -n ${QUICK:-} ]]; then
    EXTRA=(--scale 0.1 --file-size 256MiB)
fi
# In the background, so that a TERM to this script stops it at once.
"$PY" scripts/bench_python.py --meta "$META" --redis "127.0.0.1:$REDIS_PORT" \
    --shm-dir "$SHM" "${EXTRA[@]}" "$@" &
DRIVER_PID=$!
wait "$DRIVER_PID"

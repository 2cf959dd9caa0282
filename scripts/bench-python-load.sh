#!/usr/bin/env bash
# Bulk load from Python (issue 38, acceptance 5): a million 100 B values with
# NodeKernel's `Client.put_many` against redis-py pipelined SETs, three runs
# in one process, printing the ratio (target: NodeKernel's time at most 1.5x
# Redis's) and the memory each used.
#
#   scripts/bench-python-load.sh [--out results.jsonl] [bench_python_load.py options]
#
# Starts its own cluster (`nk up`, DRAM only) and Redis server on free ports
# and stops both at exit (scripts/lib/bench-servers.sh), and runs
# scripts/bench_python_load.py with a release build of the `nodekernel`
# module in its own virtualenv (BENCH_VENV, default target/bench-venv).
#
# Environment:
#   BENCH_VENV=DIR  the benchmark's virtualenv (made if missing)
#   NO_BUILD=1      use the nk binary and the module installed already
#   NK_DRAM=SIZE    the cluster's DRAM (default 4GiB)
#   QUICK=1         a smoke run (100,000 values)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BENCH_NAME=bench-python-load
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
bench_prepare

echo "== starting nk up and redis-server ==" >&2
bench_start_nk "${NK_DRAM:-4GiB}"
bench_start_redis
echo "== cluster at $META, redis at 127.0.0.1:$REDIS_PORT ==" >&2

EXTRA=()
if [[ -n ${QUICK:-} ]]; then
    EXTRA=(-n 100000)
fi
# In the background, so that a TERM to this script stops it at once.
"$PY" scripts/bench_python_load.py --meta "$META" --redis "127.0.0.1:$REDIS_PORT" \
    --nk-pid "$NK_PID" --redis-pid "$REDIS_PID" "${EXTRA[@]}" "$@" &
DRIVER_PID=$!
wait "$DRIVER_PID"

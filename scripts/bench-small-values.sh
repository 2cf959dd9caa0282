#!/usr/bin/env bash
# Memory per small value (issue #12): a million KeyValues of 100 B and of
# 1 KiB in NodeKernel and in Redis, in one run.
#
#   scripts/bench-small-values.sh [--out results.jsonl] [bench_small_values.py options]
#
# Starts its own cluster (`nk up`, 3 GiB of DRAM, no file tier) and its own
# Redis server on free ports, stops both at exit, loads the values through
# the asyncio Python client (release build in BENCH_VENV, see
# scripts/lib/bench-servers.sh) and through redis-py pipelines, and prints a
# Markdown table. NO_BUILD=1 reuses the build; QUICK=1 loads 100,000 keys.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BENCH_NAME=bench-small-values
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
bench_prepare

echo "== starting nk up and redis-server ==" >&2
bench_start_nk 3GiB
bench_start_redis
echo "== cluster at $META, redis at 127.0.0.1:$REDIS_PORT ==" >&2

EXTRA=()
if [[ -n ${QUICK:-} ]]; then
    EXTRA=(--count 100000)
fi
"$PY" scripts/bench_small_values.py --meta "$META" --redis "127.0.0.1:$REDIS_PORT" \
    --nk-pid "$NK_PID" --redis-pid "$REDIS_PID" "${EXTRA[@]}" "$@" &
DRIVER_PID=$!
wait "$DRIVER_PID"

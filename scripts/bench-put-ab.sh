#!/usr/bin/env bash
# A/B of small puts between two `nk` binaries (docs/benchmarks.md, "Puts in
# one exchange"):
#   scripts/bench-put-ab.sh OLD_NK NEW_NK [ROUNDS]
# Each round starts `nk up --dram 1GiB --file 0` with each binary in turn (the
# order alternates) and runs `nk bench putkey -c 1 -k 10000 -w 1000` with
# SIZE 100 B and 1 KiB, co-located and --remote, replacing one of 100 keys
# (--keys 100), then 1 KiB --remote into new keys of a non-enumerable table.
# Prints one line per run: binary, row, p50, p90, p99 (µs), puts/s.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2 ROUNDS=${3:-3}
WORK=$(mktemp -d)
UP_PID=
cleanup() {
    [[ -n "$UP_PID" ]] && kill -TERM "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

run() { # NAME NK
    local name=$1 nk=$2
    "$nk" up --port 0 --dram 1GiB --file 0 --data-dir "$WORK/data-$name" >"$WORK/up.log" 2>"$WORK/up.err" &
    UP_PID=$!
    for _ in $(seq 1 600); do
        grep -q "metadata server at" "$WORK/up.log" 2>/dev/null && break
        kill -0 "$UP_PID" 2>/dev/null || { cat "$WORK/up.err" >&2; exit 1; }
        sleep 0.1
    done
    export NK_META
    NK_META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$WORK/up.log" | head -n 1)
    row() { # TAG ARGS...
        local tag=$1; shift
        "$nk" bench putkey -c 1 -k 10000 -w 1000 "$@" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
l = r["latency_us"]
print(sys.argv[1], sys.argv[2], l["p50"], l.get("p90"), l.get("p99"), round(r.get("ops_per_sec", 0)))
' "$name" "$tag"
    }
    for path in colocated remote; do
        flag=(); [[ $path == remote ]] && flag=(--remote)
        for size in 100 1KiB; do
            row "$path-$size-replacing" -s "$size" --keys 100 "${flag[@]}"
        done
    done
    row "remote-1KiB-new-keys" -s 1KiB --new-keys --non-enumerable --remote
    kill -TERM "$UP_PID"; wait "$UP_PID" || true; UP_PID=
    rm -rf "$WORK/data-$name"
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r of $ROUNDS" >&2
    if (( r % 2 )); then
        run old "$OLD"; run new "$NEW"
    else
        run new "$NEW"; run old "$OLD"
    fi
done

#!/usr/bin/env bash
# The data-path comparison: NodeKernel against Redis (started for the run)
# and against this machine's memcpy and loopback-TCP bandwidth, co-located
# (shared-memory data path) and --remote (network path). Starts its own
# `nk up`, runs everything in one go and prints the markdown tables of
# docs/benchmarks.md with every target marked met or missed.
# Needs redis-server and redis-benchmark (apt-get install redis-server redis-tools).
# QUICK=1 runs a short version (smaller counts) for a smoke test; SEQ_ONLY=1
# only the sequential rows and baselines.
# Results land in $OUT (JSON lines; default a temporary file).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin nk >&2
NK="$PWD/target/release/nk"
WORK=$(mktemp -d)
OUT=${OUT:-$WORK/results.jsonl}
: >"$OUT"
cleanup() {
    [[ -n "${UP_PID:-}" ]] && kill -TERM "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$NK" up --port 0 --dram "${DRAM:-6GiB}" --file 0 --data-dir "$WORK/data" >"$WORK/up.log" 2>"$WORK/up.err" &
UP_PID=$!
# A DRAM store reserves its memory at start: about a second per GiB.
for _ in $(seq 1 600); do
    grep -q "metadata server at" "$WORK/up.log" 2>/dev/null && break
    kill -0 "$UP_PID" 2>/dev/null || break
    sleep 0.1
done
NK_META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$WORK/up.log" | head -n 1)
export NK_META
[[ -n "$NK_META" ]] || { cat "$WORK/up.err" >&2; exit 1; }

# Operation counts are divided by DIV (default 4: about 15 minutes on 2 cores;
# QUICK=1 means DIV=20). The 4 GiB file runs are never scaled down.
DIV=${DIV:-4}; [[ ${QUICK:-0} == 1 ]] && DIV=20
scale() { echo $(( ($1 + DIV - 1) / DIV )); }
# record TAG ARGS...: runs nk bench ARGS --json and appends {"tag":..., "report":...}
record() {
    local tag=$1; shift
    echo "  $tag: nk bench $*" >&2
    "$NK" bench "$@" --json | python3 -c 'import json,sys; print(json.dumps({"tag": sys.argv[1], "report": json.load(sys.stdin)}))' "$tag" >>"$OUT"
}

# SEQ_ONLY=1: only the sequential 4 GiB rows and the baselines (about a
# minute), e.g. three times in a row for the "every one of three runs" targets.
SIZES="4 1KiB 64KiB 1MiB 16MiB"; [[ ${SEQ_ONLY:-0} == 1 ]] && SIZES=""
for path in colocated remote; do
    flag=(); [[ $path == remote ]] && flag=(--remote)
    for size in $SIZES; do
        case $size in
            4|1KiB) k=$(scale 20000); keys=100 ;;
            64KiB) k=$(scale 5000); keys=100 ;;
            1MiB) k=$(scale 1000); keys=8 ;;
            16MiB) k=$(scale 100); keys=2 ;;
        esac
        for c in 1 16; do
            kc=$(( k / c > 50 ? k / c : 50 ))
            record "getkey $path $size c$c" getkey -s "$size" -c "$c" -k "$kc" -w $(( kc / 10 )) --keys "$keys" --vs redis "${flag[@]}"
            record "putkey $path $size c$c" putkey -s "$size" -c "$c" -k "$kc" -w $(( kc / 10 )) --keys "$keys" --vs redis "${flag[@]}"
        done
    done
    blocks=256
    record "write $path" write -s 16MiB -k "$blocks" -w 0 "${flag[@]}"
    record "read $path" read -s 16MiB -k "$blocks" -w 8 --qd 4 "${flag[@]}"
done
[[ ${SEQ_ONLY:-0} == 1 ]] || record "lookup c16" lookup -c 16 -k $(scale 20000) -w 1000 --vs redis
record "memcpy" memcpy -s 16MiB -k 256 -w 16
record "tcp" tcp -s 1MiB -k 4096 -w 256

python3 scripts/bench_tables.py "$OUT"

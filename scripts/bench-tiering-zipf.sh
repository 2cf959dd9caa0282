#!/usr/bin/env bash
# Tier migration under a skewed workload: `nk bench zipf` (files picked by a
# Zipf distribution, read whole or, 10% of the time, replaced by a fresh
# put) over data 4x the DRAM class, once with migration off and once with
# migration and promotion on, each on its own fresh `nk up`. Prints the
# share of read bytes DRAM served, throughput, latency and the blocks
# migration moved side by side, with the on/off ratios (the table of
# docs/benchmarks.md). A few minutes on 2 cores.
#
# Settings (environment): DRAM (64MiB), FILE (file class, 512MiB), DATA
# (256MiB), SIZE (file size = block size, 1MiB), ZIPF (0.99), WRITE_SHARE
# (0.1), CLIENTS (1), WARMUP (warm-up operations per client, long enough
# for migration to settle: 6000), COUNT (measured operations per client,
# 6000), NO_BUILD=1 (use target/release/nk as it is). The JSON reports are
# kept in $OUT (default: a temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${NO_BUILD:-} ]] || cargo build --release -p nodekernel-cli >&2
NK=$PWD/target/release/nk
DRAM=${DRAM:-64MiB} FILE=${FILE:-512MiB} DATA=${DATA:-256MiB} SIZE=${SIZE:-1MiB}
ZIPF=${ZIPF:-0.99} WRITE_SHARE=${WRITE_SHARE:-0.1} CLIENTS=${CLIENTS:-1}
WARMUP=${WARMUP:-6000} COUNT=${COUNT:-6000}
# The file class on disk (O_DIRECT), not on a tmpfs.
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/nk-zipf.XXXXXX")
OUT=${OUT:-$WORK}
mkdir -p "$OUT"
UP_PID=
cleanup() {
    if [[ -n $UP_PID ]] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run NAME MIGRATION PROMOTION: one fresh cluster, one zipf run, stopped.
run() {
    local name=$1 cfg=$WORK/$1.toml log=$WORK/$1.up.log meta
    printf '[meta]\nblock_size = "%s"\nmigration = %s\npromotion = %s\n' \
        "$SIZE" "$2" "$3" >"$cfg"
    "$NK" up --config "$cfg" --port 0 --dram "$DRAM" --file "$FILE" \
        --data-dir "$WORK/data-$name" >"$log" 2>"$WORK/$name.up.err" &
    UP_PID=$!
    timeout 60 sh -c "until grep -q 'metadata server at' '$log'; do
        kill -0 $UP_PID 2>/dev/null || exit 1; sleep 0.1; done" ||
        { cat "$WORK/$name.up.err" >&2; echo "nk up did not start" >&2; exit 1; }
    meta=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$log" | head -n 1)
    "$NK" --meta "$meta" status --wait --timeout 120 >/dev/null
    echo "== migration $name: nk bench zipf -s $SIZE --data $DATA --zipf $ZIPF" \
        "--write-share $WRITE_SHARE -c $CLIENTS -w $WARMUP -k $COUNT ==" >&2
    "$NK" --meta "$meta" bench zipf -s "$SIZE" --data "$DATA" --zipf "$ZIPF" \
        --write-share "$WRITE_SHARE" -c "$CLIENTS" -w "$WARMUP" -k "$COUNT" --json \
        >"$OUT/$name.json"
    kill -TERM "$UP_PID"
    wait "$UP_PID" || true
    UP_PID=
}

run off false false
run on true true

echo "DRAM $DRAM, file class $FILE, data $DATA in files of $SIZE (1 block each)," \
    "zipf $ZIPF, $WRITE_SHARE writes, $CLIENTS client(s), $WARMUP warm-up +" \
    "$COUNT measured operations per client"
python3 - "$OUT/off.json" "$OUT/on.json" <<'EOF'
import json, sys
off, on = (json.load(open(p)) for p in sys.argv[1:3])
rows = [
    ("reads from DRAM", lambda r: 100 * r["zipf"]["dram_read_share"], "{:.1f}%"),
    ("throughput MB/s", lambda r: r["mb_per_sec"], "{:.0f}"),
    ("ops/s", lambda r: r["ops_per_sec"], "{:.0f}"),
    ("p50 latency µs", lambda r: r["latency_us"]["p50"], "{:.0f}"),
    ("p99 latency µs", lambda r: r["latency_us"]["p99"], "{:.0f}"),
    ("blocks demoted (warm-up + measured)", lambda r: r["zipf"]["blocks_demoted"], "{}"),
    ("blocks promoted (warm-up + measured)", lambda r: r["zipf"]["blocks_promoted"], "{}"),
    ("blocks demoted while creating the files", lambda r: r["zipf"]["setup_blocks_demoted"], "{}"),
]
print("| | migration off | migration + promotion on | on / off |")
print("|---|---:|---:|---:|")
for name, get, fmt in rows:
    a, b = get(off), get(on)
    ratio = f"{b / a:.2f}x" if a else "-"
    print(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
EOF

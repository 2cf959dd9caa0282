#!/usr/bin/env bash
# A/B of the small-operation rows (getkey/putkey 4 B and 1 KiB, one client,
# co-located and remote; lookups with 16 clients) between two `nk` binaries:
#   scripts/bench-ab.sh OLD_NK NEW_NK [ROUNDS]
# Each round starts `nk up` with each binary in turn (so both see the same
# machine state; the order alternates), runs every row, and stops it. Prints the median p50 (and
# lookups/s) per row and binary, and NEW/OLD. Each binary talks only to its
# own cluster, so wire versions may differ.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2 ROUNDS=${3:-3}
WORK=$(mktemp -d)
OUT="$WORK/ab.jsonl"
UP_PID=
cleanup() {
    [[ -n "$UP_PID" ]] && kill -TERM "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

run_rows() { # NAME NK
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
    rec() { # TAG ARGS...
        local tag=$1; shift
        "$nk" bench "$@" --json | python3 -c 'import json,sys; print(json.dumps({"bin": sys.argv[1], "tag": sys.argv[2], "report": json.load(sys.stdin)}))' "$name" "$tag" >>"$OUT"
    }
    for path in colocated remote; do
        flag=(); [[ $path == remote ]] && flag=(--remote)
        for size in 4 1KiB; do
            rec "getkey $path $size c1" getkey -s "$size" -c 1 -k 5000 -w 500 --keys 100 "${flag[@]}"
            rec "putkey $path $size c1" putkey -s "$size" -c 1 -k 5000 -w 500 --keys 100 "${flag[@]}"
        done
    done
    rec "lookup c16" lookup -c 16 -k 5000 -w 1000
    kill -TERM "$UP_PID"; wait "$UP_PID" || true; UP_PID=
    rm -rf "$WORK/data-$name"
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r of $ROUNDS" >&2
    # Alternate which binary goes first: a cluster's start and stop can
    # disturb the run right after it.
    if (( r % 2 )); then
        run_rows old "$OLD"; run_rows new "$NEW"
    else
        run_rows new "$NEW"; run_rows old "$OLD"
    fi
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rep = r["report"]
    val = rep["ops_per_sec"] if r["tag"].startswith("lookup") else rep["latency_us"]["p50"]
    rows.setdefault(r["tag"], {}).setdefault(r["bin"], []).append(val)
print("| row | metric | old (median) | new (median) | new/old | old runs | new runs |")
print("|---|---|---:|---:|---:|---|---|")
for tag, v in rows.items():
    metric = "ops/s" if tag.startswith("lookup") else "p50 µs"
    o, n = statistics.median(v["old"]), statistics.median(v["new"])
    fmt = lambda xs: ", ".join(f"{x:.0f}" if metric == "ops/s" else f"{x:.1f}" for x in xs)
    print(f"| {tag} | {metric} | {o:.1f} | {n:.1f} | {n / o:.2f}x | {fmt(v['old'])} | {fmt(v['new'])} |")
EOF

#!/usr/bin/env bash
# A/B of the small-operation rows (getkey/putkey 4 B and 1 KiB, one client,
# co-located and remote; lookups with 16 clients) between two `nk` binaries:
#   scripts/bench-ab.sh OLD_NK NEW_NK [ROUNDS]
# ROWS picks other rows:
#   large  the remote data path: getkey/putkey of 64 KiB and 1 MiB, one
#          client, --remote (p50), and sequential write and read of a 1 GiB
#          File in 16 MiB operations, --remote (GB/s)
#   put    small puts (docs/benchmarks.md, "Puts in one exchange"): putkey
#          of 100 B and 1 KiB replacing one of 100 keys, one client,
#          co-located and --remote; 1 KiB with 16 clients, co-located and
#          --remote; 1 KiB into new keys of a non-enumerable Table, --remote
#   scale  16 clients: getkey and putkey of 1 KiB, co-located and --remote
# Each round starts `nk up` with each binary in turn (so both see the same
# machine state; the order alternates), runs every row, and stops it.
# Prints the median p50 and ops/s (GB/s for streams, lookups/s) per row and
# binary, NEW/OLD, and every run's value. Each binary talks only to its own
# cluster, so wire versions may differ. OUT=FILE keeps the JSON reports.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2 ROUNDS=${3:-3}
WORK=$(mktemp -d)
OUT=${OUT:-$WORK/ab.jsonl}
: >"$OUT"
UP_PID=
cleanup() {
    [[ -n "$UP_PID" ]] && kill -TERM "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

run_rows() { # NAME NK
    local name=$1 nk=$2
    local dram=1GiB; [[ ${ROWS:-small} == large ]] && dram=2GiB
    "$nk" up --port 0 --dram "$dram" --file 0 --data-dir "$WORK/data-$name" >"$WORK/up.log" 2>"$WORK/up.err" &
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
    case ${ROWS:-small} in
    large)
        for size in 64KiB 1MiB; do
            k=2000; [[ $size == 1MiB ]] && k=500
            rec "getkey remote $size c1" getkey -s "$size" -c 1 -k $k -w $(( k / 10 )) --keys 8 --remote
            rec "putkey remote $size c1" putkey -s "$size" -c 1 -k $k -w $(( k / 10 )) --keys 8 --remote
        done
        rec "write remote 1GiB" write -s 16MiB -k 64 -w 0 --remote
        rec "read remote 1GiB" read -s 16MiB -k 64 -w 4 --qd 4 --remote
        ;;
    put)
        for path in colocated remote; do
            flag=(); [[ $path == remote ]] && flag=(--remote)
            for size in 100 1KiB; do
                rec "putkey $path $size replacing c1" putkey -s "$size" -c 1 -k 10000 -w 1000 --keys 100 "${flag[@]}"
            done
            rec "putkey $path 1KiB replacing c16" putkey -s 1KiB -c 16 -k 1500 -w 150 --keys 100 "${flag[@]}"
        done
        rec "putkey remote 1KiB new keys c1" putkey -s 1KiB -c 1 -k 10000 -w 1000 --new-keys --non-enumerable --remote
        ;;
    scale)
        for path in colocated remote; do
            flag=(); [[ $path == remote ]] && flag=(--remote)
            rec "getkey $path 1KiB c16" getkey -s 1KiB -c 16 -k 3000 -w 300 --keys 100 "${flag[@]}"
            rec "putkey $path 1KiB c16" putkey -s 1KiB -c 16 -k 1500 -w 150 --keys 100 "${flag[@]}"
        done
        ;;
    *)
        for path in colocated remote; do
            flag=(); [[ $path == remote ]] && flag=(--remote)
            for size in 4 1KiB; do
                rec "getkey $path $size c1" getkey -s "$size" -c 1 -k 5000 -w 500 --keys 100 "${flag[@]}"
                rec "putkey $path $size c1" putkey -s "$size" -c 1 -k 5000 -w 500 --keys 100 "${flag[@]}"
            done
        done
        rec "lookup c16" lookup -c 16 -k 5000 -w 1000
        ;;
    esac
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
    tag = r["tag"]
    if tag.startswith("lookup"):
        vals = [("ops/s", rep["ops_per_sec"])]
    elif tag.startswith(("read", "write")):
        vals = [("GB/s", rep["gb_per_sec"])]
    else:
        vals = [("p50 µs", rep["latency_us"]["p50"]), ("ops/s", rep["ops_per_sec"])]
    for metric, val in vals:
        rows.setdefault((tag, metric), {}).setdefault(r["bin"], []).append(val)
print("| row | metric | old (median) | new (median) | new/old | old runs | new runs |")
print("|---|---|---:|---:|---:|---|---|")
for (tag, metric), v in rows.items():
    o, n = statistics.median(v["old"]), statistics.median(v["new"])
    digits = {"ops/s": 0, "GB/s": 2}.get(metric, 1)
    fmt = lambda xs: ", ".join(f"{x:.{digits}f}" for x in xs)
    print(f"| {tag} | {metric} | {o:.{digits}f} | {n:.{digits}f} | {n / o:.2f}x | {fmt(v['old'])} | {fmt(v['new'])} |")
EOF

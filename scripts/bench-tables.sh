#!/usr/bin/env bash
# Enumerable vs non-enumerable Tables: KeyValue puts of new keys, 1 and 4
# clients, in one run against an embedded cluster. Prints a markdown table
# (the one in docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin nk >&2
NK=target/release/nk
K=${K:-20000}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for c in 1 4; do
    for ne in "" "--non-enumerable"; do
        "$NK" bench putkey --new-keys --embedded --block-size 4KiB --dram 1GiB -k "$K" -w 2000 -c "$c" $ne --json \
            | tr -d '\n' >>"$OUT"
        echo >>"$OUT"
    done
done
python3 - "$OUT" <<'PY'
import json, sys
print("| table | clients | puts/s | p50 us | p99 us |")
print("|---|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    kind = "non-enumerable" if r["non_enumerable"] else "enumerable"
    l = r["latency_us"]
    print(f"| {kind} | {r['clients']} | {r['ops_per_sec']:.0f} | {l['p50']:.1f} | {l['p99']:.1f} |")
PY

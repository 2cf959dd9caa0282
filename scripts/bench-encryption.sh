#!/usr/bin/env bash
# The cost of client-side encryption (docs/encryption.md), in one run: one
# `nk up` with two DRAM classes of the same size, class 0 plain and class 1
# `encrypt = true`, and the same `nk bench` workloads on each (--class),
# co-located (shared-memory data path) and as a remote client (--remote:
# network data path over loopback). Prints a Markdown table with the
# encrypted/plain ratio of every row (docs/benchmarks.md keeps the results).
#
#   ./scripts/bench-encryption.sh            # SEQ=1GiB of 1 MiB ops, RAND=20000 4 KiB reads
#   SEQ_OPS=256 RAND_OPS=5000 ./scripts/bench-encryption.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SEQ_OPS=${SEQ_OPS:-1024}
RAND_OPS=${RAND_OPS:-20000}

cargo build --release --bin nk --quiet
NK="$PWD/target/release/nk"
WORK=$(mktemp -d)
cleanup() {
    [[ -n "${UP_PID:-}" ]] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

"$NK" key new "$WORK/key" >/dev/null
export NK_ENCRYPTION_KEY_FILE="$WORK/key"
cat >"$WORK/nk.toml" <<EOF
[[class]]
id = 0
name = "dram"

[[class]]
id = 1
name = "dram-encrypted"
encrypt = true

[[store]]
class = 0
class_name = "dram"
size = "2GiB"

[[store]]
class = 1
class_name = "dram-encrypted"
size = "2GiB"
EOF

source scripts/lib/nk-up.sh
nk_up_start "$WORK/up.log" --config "$WORK/nk.toml" --data-dir "$WORK/data"

# One `nk bench` run as JSON: "<MB/s> <ops/s> <p50 µs>".
run() {
    "$NK" bench "$@" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("%.1f %.0f %.1f" % (r["mb_per_sec"], r["ops_per_sec"], r["latency_us"]["p50"]))'
}

echo "| path | workload | plain | encrypted | encrypted / plain |"
echo "|---|---|---|---|---|"
for path in shared-memory remote; do
    flags=()
    [[ $path == remote ]] && flags=(--remote)
    for w in "write -s 1MiB -k $SEQ_OPS -w 64" "read -s 1MiB -k $SEQ_OPS -w 64" \
        "randread -s 4KiB -k $RAND_OPS -w 1000"; do
        read -r mb0 ops0 p0 <<<"$(run $w --class 0 "${flags[@]}")"
        read -r mb1 ops1 p1 <<<"$(run $w --class 1 "${flags[@]}")"
        name=$(echo "$w" | cut -d' ' -f1-3)
        if [[ $w == randread* ]]; then
            echo "| $path | $name, 1 client, qd 1 | $ops0 ops/s (p50 $p0 µs) | $ops1 ops/s (p50 $p1 µs) | $(python3 -c "print(f'{$ops1/$ops0:.2f}x')") |"
        else
            echo "| $path | $name, 1 client | $mb0 MB/s | $mb1 MB/s | $(python3 -c "print(f'{$mb1/$mb0:.2f}x')") |"
        fi
    done
done

#!/usr/bin/env bash
# What small containers cost (issue 38): trees of N directories holding one
# File each, copied in with `nk put -r`, against the same tree on the local
# disk, in one run. NodeKernel's cost is the growth of the cluster's used
# bytes (`nk status --json`: blocks in use, all classes, 1 MiB blocks); the
# disk's is `du` of the tree (allocated blocks, directories included).
#
#   scripts/bench-containers.sh            # prints a Markdown table
#
# Starts its own cluster (`nk up`, 2 GiB of DRAM, no file tier), stops it at
# exit. NO_BUILD=1 reuses the release build; NK_BIN=path runs another nk
# (byte counts do not depend on the build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BENCH_NAME=bench-containers
BENCH_NO_REDIS=1
if [[ -z ${NO_BUILD:-}${NK_BIN:-} ]]; then
    cargo build --release -p nodekernel-cli >&2
fi
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
NK=${NK_BIN:-$NK}
bench_start_nk 2GiB
export NK_META=$META

used() {
    "$NK" status --json | python3 -c 'import json,sys; print(sum(s["used_bytes"] for s in json.load(sys.stdin)["servers"]))'
}

# tree DIR N SIZE: N directories under DIR, each with one File of SIZE bytes.
tree() {
    mkdir -p "$1"
    for i in $(seq "$2"); do
        mkdir "$1/d$i"
        head -c "$3" /dev/zero >"$1/d$i/f"
    done
}

echo "| directories | File size | NodeKernel used | per directory | disk (du) | NodeKernel / disk |"
echo "|---:|---:|---:|---:|---:|---:|"
case=0
for spec in "50 0" "1000 0" "1000 100"; do
    read -r n size <<<"$spec"
    case=$((case + 1))
    local_tree=$TMP/tree$case
    tree "$local_tree" "$n" "$size"
    disk=$(($(du -sk "$local_tree" | cut -f1) * 1024))
    before=$(used)
    "$NK" put -r --parallel 8 "$local_tree" / >/dev/null
    after=$(used)
    grew=$((after - before))
    python3 - "$n" "$size" "$grew" "$disk" <<'PY'
import sys
n, size, grew, disk = map(int, sys.argv[1:])
mib = lambda b: f"{b / 2**20:.2f} MiB"
print(f"| {n:,} | {size} B | {mib(grew)} | {grew / n / 1024:.1f} KiB | {mib(disk)} | {grew / disk:.2f}× |")
PY
    "$NK" rm -r "/tree$case" >/dev/null
done

#!/usr/bin/env bash
# A/B of the mount's small-file rows (bench-fuse.sh's create + write 100 B,
# stat, unlink) between two `nk` binaries, alternating, in rounds:
#   scripts/bench-fuse-ab.sh OLD_NK NEW_NK [ROUNDS]     # FILES=10000 by default
# Prints each run's rows (tmpfs, disk, mount, ratios) under a heading
# naming the round and the binary; docs/benchmarks.md keeps the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$(realpath "$1") NEW=$(realpath "$2") ROUNDS=${3:-3}
for round in $(seq "$ROUNDS"); do
    for which in old new; do
        bin=$OLD
        [[ $which == new ]] && bin=$NEW
        echo "## round $round: $which ($bin)"
        ONLY_META=1 NK_BIN=$bin FILES=${FILES:-10000} ./scripts/bench-fuse.sh 2>/dev/null |
            grep -E '^\| (create|stat|unlink)'
    done
done

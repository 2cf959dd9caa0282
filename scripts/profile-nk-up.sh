#!/usr/bin/env bash
# profile-nk-up.sh NAME BENCH-ARGS...: a fresh `nk up`, then `perf record -a -g` over
# one `nk bench` run; prints the top symbols by process.
set -euo pipefail
NAME=$1; shift
cd "$(dirname "$0")/.."; NK="$PWD/target/release/nk"; OUTDIR=${OUTDIR:-$PWD/target/profiles}; mkdir -p "$OUTDIR"
W=$(mktemp -d)
"$NK" up --port 0 --dram 6GiB --file 0 --data-dir "$W/d" >"$W/up.log" 2>&1 &
UP=$!
for _ in $(seq 600); do grep -q "metadata server at" "$W/up.log" && break; sleep 0.1; done
export NK_META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$W/up.log" | head -1)
sleep 8 # prefault settles
perf record -a -g -F 999 -o $OUTDIR/$NAME.data -- "$NK" bench "$@" 2>&1 | grep -E "ops/s|p50|error" || true
kill -TERM $UP; wait $UP || true
rm -rf "$W"
perf report -i $OUTDIR/$NAME.data --no-children --sort comm,dso,sym --percent-limit 1.5 --stdio 2>/dev/null | grep -v "^$" | grep -E "^ +[0-9]" | head -40 > $OUTDIR/$NAME.top
cat $OUTDIR/$NAME.top

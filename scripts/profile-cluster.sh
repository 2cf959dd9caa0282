#!/usr/bin/env bash
# profile-cluster.sh NAME N ARGS...: nk meta + N DRAM stores (as bench-scale.sh; servers get
# NK_POLL_SPIN_US=$SSPIN when set), then perf record -a -g over one nk bench run.
set -uo pipefail
cd "$(dirname "$0")/.."; NK=${NK:-$PWD/target/release/nk}; NAME=$1; N=$2; shift 2; OUTDIR=${OUTDIR:-$PWD/target/profiles}; mkdir -p "$OUTDIR"
ENVS=(); [[ -n ${SSPIN:-} ]] && ENVS=(NK_POLL_SPIN_US=$SSPIN)
D=$(mktemp -d)
# Servers refuse to run without a cluster token (docs/security.md): every
# server and client of this run uses this one.
export NK_TOKEN_FILE="$D/token"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$NK_TOKEN_FILE")
env "${ENVS[@]}" $NK meta --listen 127.0.0.1:0 >$D/meta.log 2>&1 & P=($!)
for _ in $(seq 100); do META=$(sed -n 's/.*metadata server listening on \([^ ]*\).*/\1/p' $D/meta.log | head -1); [[ -n $META ]] && break; sleep 0.1; done
for i in $(seq $N); do mkdir -p $D/s$i; env "${ENVS[@]}" $NK store --meta $META --class 0 --medium dram --size $((2048 / N))MiB --listen 127.0.0.1:0 --data-dir $D/s$i >$D/s$i.log 2>&1 & P+=($!); done
sleep 8
if [[ -n ${NOPERF:-} ]]; then
  NK_META=$META $NK bench "$@" 2>&1 | grep -E "ops/s|p50|p99|rror" | head -3
else
  NK_META=$META perf record -a -g -F 499 -o $OUTDIR/$NAME.data -- $NK bench "$@" 2>&1 | grep -E "ops/s|p50|p99|rror" | head -3
  perf report -i $OUTDIR/$NAME.data --no-children --sort comm,sym --percent-limit 1.5 --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -25 > $OUTDIR/$NAME.top
  perf report -i $OUTDIR/$NAME.data --no-children --sort comm --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -8 > $OUTDIR/$NAME.comm
fi
kill ${P[@]}; wait 2>/dev/null; rm -rf $D

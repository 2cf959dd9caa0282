#!/usr/bin/env bash
# bench-persistence.sh: the cost of a persistent metadata server (issue #13).
#
# 1. create and putkey (1 KiB) rows at 1 and 16 clients against `nk meta` +
#    one DRAM `nk store` (separate processes), with the metadata server
#    volatile, then persistent with meta.fsync = never, interval and always;
# 2. the restart time of a persistent metadata server holding NODES nodes
#    (default 1,000,000 KeyValues of 4 bytes): replaying the log alone, and
#    from a checkpoint plus the log after it;
# 3. (part "stores") the data path of a persistent DRAM storage server, its
#    region a file in a data directory on the disk or on tmpfs (/dev/shm),
#    against a volatile one (a memfd), with a volatile metadata server:
#    large File writes and reads through the shared mapping, 1 KiB puts
#    and gets; and a persistent file-tier server against a volatile one.
#
# Prints a markdown table per part; OUT=FILE also keeps every JSON report.
# Environment: NK (binary), NODES, ROWS_K (ops per client at 1 client),
# PARTS ("rows restart", the default, or any of "rows restart stores"),
# MODES (default "off never interval always").
set -euo pipefail
cd "$(dirname "$0")/.."
NK=${NK:-$PWD/target/release/nk}
NODES=${NODES:-1000000}
K=${ROWS_K:-20000}
OUT=${OUT:-/dev/null}
PARTS=${PARTS:-rows restart}
[[ -x $NK ]] || cargo build --release -q -p nodekernel-cli
D=$(mktemp -d)
# Servers refuse to run without a cluster token (docs/security.md): every
# server and client of this run uses this one.
export NK_TOKEN_FILE="$D/token"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$NK_TOKEN_FILE")
PIDS=()
stop() {
  [[ ${#PIDS[@]} -gt 0 ]] && kill "${PIDS[@]}" 2>/dev/null
  wait 2>/dev/null || true
  PIDS=()
}
trap 'stop; rm -rf $D' EXIT

# start MODE [EXTRA_TOML]: meta (persistent unless MODE=off; on $LISTEN) and,
# unless STORE_UP is set, one store.
start() {
  local mode=$1 extra=${2:-}
  {
    echo "[meta]"
    if [[ $mode != off ]]; then
      echo "persistence = true"
      echo "fsync = \"$mode\""
    fi
    echo "$extra"
  } >"$D/nk.toml"
  local args=(--listen "${LISTEN:-127.0.0.1:0}")
  [[ $mode != off ]] && args+=(--data-dir "$D/meta")
  "$NK" --config "$D/nk.toml" meta "${args[@]}" >"$D/meta.log" 2>&1 &
  PIDS+=($!)
  META=
  for _ in $(seq 600); do
    META=$(sed -n 's/.*metadata server listening on \([^ ]*\).*/\1/p' "$D/meta.log" | head -1)
    [[ -n $META ]] && break
    sleep 0.05
  done
  [[ -n $META ]] || { cat "$D/meta.log"; exit 1; }
  if [[ -z ${STORE_UP:-} ]]; then
    # STORE_ARGS: another store (stores part); default one volatile DRAM GiB.
    # shellcheck disable=SC2086
    "$NK" store --meta "$META" ${STORE_ARGS:---class 0 --medium dram --size 1GiB} --listen 127.0.0.1:0 >"$D/store.log" 2>&1 &
    PIDS+=($!)
  fi
  NK_META=$META "$NK" status --wait >/dev/null 2>&1
}

row() { # row MODE ARGS...: one nk bench run, as a table row
  local mode=$1
  shift
  local j
  j=$(NK_META=$META "$NK" bench "$@" --json)
  echo "$j" >>"$OUT"
  python3 - "$mode" "$*" "$j" <<'EOF'
import json, sys
mode, args, r = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
print(f"| {mode} | {args} | {r['ops_per_sec']:.0f} | {r['latency_us']['p50']:.1f} | {r['latency_us']['p99']:.1f} |")
EOF
}

if [[ $PARTS == *rows* ]]; then
echo "## Requests with persistence off and on ($(date -u +%F), $(nproc) vCPUs)"
echo
echo "| metadata server | nk bench | ops/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|"
for mode in ${MODES:-off never interval always}; do
  start $mode
  row $mode create -k "$K" -w 1000 -c 1
  row $mode create -k $((K / 8)) -w 200 -c 16
  row $mode putkey -s 1KiB -k "$K" -w 1000 -c 1 --keys 1000
  row $mode putkey -s 1KiB -k $((K / 8)) -w 200 -c 16 --keys 1000
  stop
  rm -rf "$D/meta"
done
echo
fi

if [[ $PARTS == *stores* ]]; then
echo "## Persistent storage servers: the data path ($(date -u +%F), $(nproc) vCPUs)"
echo
echo "| storage server | nk bench | ops/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|"
SHM=$(mktemp -d -p /dev/shm nk-bench-XXXXXX)
trap 'stop; rm -rf $D $SHM' EXIT
for store in "dram volatile" "dram persistent, /dev/shm" "dram persistent, disk" "file volatile" "file persistent, disk"; do
  case $store in
    "dram volatile") args="--class 0 --medium dram --size 1GiB" ;;
    "dram persistent, /dev/shm") args="--class 0 --medium dram --size 1GiB --persistent --data-dir $SHM/s" ;;
    "dram persistent, disk") args="--class 0 --medium dram --size 1GiB --persistent --data-dir $D/s" ;;
    "file volatile") args="--class 0 --medium file --size 2GiB --data-dir $D/s" ;;
    "file persistent, disk") args="--class 0 --medium file --size 2GiB --persistent --data-dir $D/s" ;;
  esac
  STORE_ARGS=$args start off
  row "$store" write -s 1MiB -k 512 -w 64 -c 1
  row "$store" read -s 1MiB -k 512 -w 64 -c 1
  row "$store" putkey -s 1KiB -k "$K" -w 1000 -c 1 --keys 1000
  row "$store" getkey -s 1KiB -k "$K" -w 1000 -c 1 --keys 1000
  stop
  rm -rf "$D/s" "$SHM/s"
done
echo
fi

[[ $PARTS == *restart* ]] || exit 0
echo "## Restart of a metadata server holding $NODES KeyValues"
echo
echo "| restart from | log records replayed | nodes | start to listening (s) | the server's own count | last checkpoint while loading |"
echo "|---|---|---|---|---|---|"
for how in log checkpoint; do
  # Without checkpoints the log holds everything; with them, the last
  # checkpoint and its tail.
  after='checkpoint_after = "1TiB"'
  [[ $how == checkpoint ]] && after='checkpoint_after = "64MiB"'
  start always "$after"
  NK_META=$META "$NK" bench putkey -s 4 -k $((NODES / 16)) -w 0 -c 16 --new-keys --non-enumerable --keep --json >>"$OUT" 2>/dev/null
  ckpt=$(grep "checkpoint of" "$D/meta.log" | tail -1 | sed -n 's/.*checkpoint of \([0-9]*\) nodes.*(\([0-9]*\) records replayed.* in \([0-9.]*\) ms.*/\1 nodes (\2 records onto the previous one), \3 ms in the background/p' || true)
  kill -9 "${PIDS[0]}"
  wait "${PIDS[0]}" 2>/dev/null || true
  PIDS=("${PIDS[@]:1}")
  t0=$(date +%s.%N)
  LISTEN=$META STORE_UP=1 start always "$after"
  t1=$(date +%s.%N)
  line=$(grep -m1 "restored" "$D/meta.log" || true)
  nodes=$(echo "$line" | sed -n 's/.*restored \([0-9]*\) nodes.*/\1/p')
  records=$(echo "$line" | sed -n 's/.* and \([0-9]*\) later log records.*/\1/p')
  took=$(echo "$line" | sed -n 's/.*(\([0-9.]*\) ms).*/\1/p')
  printf '| %s | %s | %s | %.2f | %s ms | %s |\n' "$how" "$records" "$nodes" "$(echo "$t1 - $t0" | bc)" "$took" "${ckpt:-none}"
  stop
  rm -rf "$D/meta"
done

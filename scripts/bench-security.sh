#!/usr/bin/env bash
# bench-security.sh: what TLS costs on the TCP transport (issue #17).
#
# Starts `nk up` (one DRAM storage server) twice, plain and with
# [security.tls] (an authority and node certificate from `nk tls new`), and
# runs the same `nk bench --remote` rows against each: the network data
# path and TCP for metadata, as a client on another host would. Rows:
# putkey and getkey of 1 KiB at 1 and 16 clients, sequential write and
# read of 1 MiB buffers. Prints one markdown table with the TLS/plain
# ratios; OUT=FILE also keeps every JSON report.
# Environment: NK (binary), ROWS_K (operations per 1-client row), MODES
# (default "plain tls"; "token" and "tls+token" add the cluster token).
set -euo pipefail
cd "$(dirname "$0")/.."
NK=${NK:-$PWD/target/release/nk}
K=${ROWS_K:-20000}
OUT=${OUT:-/dev/null}
MODES=${MODES:-plain tls}
[[ -x $NK ]] || cargo build --release -q -p nodekernel-cli
D=$(mktemp -d)
PID=
stop() {
  if [[ -n $PID ]]; then
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  PID=
}
trap 'stop; rm -rf $D' EXIT
"$NK" tls new "$D/pki" --host 127.0.0.1 >/dev/null
"$NK" token new "$D/token" >/dev/null

# start MODE: `nk up` with MODE's [security], its config in $D/MODE.toml.
start() {
  local mode=$1 cfg=$D/$1.toml
  {
    echo "[client]"
    echo "unix_socket = false"
    echo "shared_memory = false"
    echo "[security]"
    if [[ $mode == *token* ]]; then echo "token_file = \"$D/token\""; else echo "insecure = true"; fi
    if [[ $mode == *tls* ]]; then
      echo "[security.tls]"
      echo "ca_file = \"$D/pki/ca.pem\""
      echo "cert_file = \"$D/pki/node.pem\""
      echo "key_file = \"$D/pki/node.key\""
    fi
  } >"$cfg"
  "$NK" --config "$cfg" up --port 0 --dram 2GiB --file 0 >"$D/up.log" 2>&1 &
  PID=$!
  META=
  for _ in $(seq 600); do
    META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$D/up.log" | head -1)
    [[ -n $META ]] && break
    sleep 0.05
  done
  [[ -n $META ]] || { cat "$D/up.log"; exit 1; }
  NK_META=$META "$NK" --config "$cfg" status --wait >/dev/null
}

ROWS=(
  "putkey -s 1KiB -k $K -w 1000 -c 1 --keys 1000"
  "getkey -s 1KiB -k $K -w 1000 -c 1 --keys 1000"
  "putkey -s 1KiB -k $((K / 4)) -w 200 -c 16 --keys 1000"
  "getkey -s 1KiB -k $((K / 4)) -w 200 -c 16 --keys 1000"
  "write -s 1MiB -k 1024 -w 64 -c 1"
  "read -s 1MiB -k 1024 -w 64 -c 1"
)
for mode in $MODES; do
  start "$mode"
  for i in "${!ROWS[@]}"; do
    # shellcheck disable=SC2086
    j=$(NK_META=$META "$NK" --config "$D/$mode.toml" bench ${ROWS[$i]} --remote --json)
    echo "$j" >>"$OUT"
    echo "$j" >"$D/$mode-$i.json"
  done
  stop
done

echo "## TLS on the TCP transport ($(date -u +%F), $(nproc) vCPUs, nk bench --remote)"
echo
python3 - "$D" "$MODES" "${ROWS[@]}" <<'EOF'
import json, sys
d, modes, rows = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
by = {(m, i): json.load(open(f"{d}/{m}-{i}.json")) for m in modes for i in range(len(rows))}
base = modes[0]
head = "| nk bench | " + " | ".join(f"{m} ops/s (MB/s) | {m} p50 µs" for m in modes)
head += "".join(f" | {m}/{base}" for m in modes[1:]) + " |"
print(head)
print("|" + "---|" * (1 + 2 * len(modes) + len(modes) - 1))
for i, row in enumerate(rows):
    cells = []
    for m in modes:
        r = by[(m, i)]
        rate = f"{r['ops_per_sec']:.0f}" + (f" ({r['mb_per_sec']:.0f})" if r['size'] >= 1 << 20 else "")
        cells += [rate, f"{r['latency_us']['p50']:.1f}"]
    ratios = [f"{by[(m, i)]['ops_per_sec'] / by[(base, i)]['ops_per_sec']:.2f}" for m in modes[1:]]
    print(f"| `{row}` | " + " | ".join(cells + ratios) + " |")
EOF

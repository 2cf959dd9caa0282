#!/usr/bin/env bash
# bench-cluster.sh: how a cluster of separate processes scales (issue #14).
#
# 1. Metadata lookups/s with 1, 2 and 4 metadata partitions: one `nk meta`
#    process per partition (meta.partition / meta.partitions set in its own
#    config file), every client and the storage server given the same
#    ordered list; `nk bench lookup --roots R` spreads the clients over R
#    top-level directories, as many owned by each partition, so every
#    partition gets the same share of the clients.
# 2. Sequential write and read GiB/s of large Files with 1, 2 and 4 DRAM
#    storage servers (`nk store` processes, one metadata server; a File's
#    blocks go round-robin over the servers), co-located (shared-memory
#    data path) and --remote (everything over TCP); then the machine's
#    one-stream baselines, memcpy and loopback TCP (`nk bench memcpy`, `tcp`).
#
# Every row also shows where the machine's CPU time went while the
# `nk bench` process ran (from /proc: the client, the metadata servers, the
# storage servers, every other process, idle), in percent of all CPUs.
#
# Prints markdown tables; OUT=FILE also keeps every JSON report (one line
# each). Everything listens on 127.0.0.1 with ports picked by the kernel and
# is stopped at exit, also on failure.
#
# Environment (defaults in brackets):
#   PARTITIONS [1 2 4], STORES [1 2 4]: the configurations (empty: skip
#   that part);
#   LOOKUP_CLIENTS [16] (a list runs each), LOOKUP_K [60000] lookups per
#   client, LOOKUP_W [2000] warm-up lookups per client, LOOKUP_ROOTS [16];
#   SEQ_SIZE [16MiB] bytes per operation, SEQ_K [256] operations (the File
#   is SEQ_K x SEQ_SIZE), SEQ_W [8] warm-up operations, SEQ_QD [4] reads in
#   flight, SEQ_PATHS [colocated remote];
#   NO_BUILD=1 to use target/release/nk as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

PARTITIONS=${PARTITIONS-1 2 4}
STORES=${STORES-1 2 4}
LOOKUP_CLIENTS=${LOOKUP_CLIENTS:-16}
LOOKUP_K=${LOOKUP_K:-60000}
LOOKUP_W=${LOOKUP_W:-2000}
LOOKUP_ROOTS=${LOOKUP_ROOTS:-16}
SEQ_SIZE=${SEQ_SIZE:-16MiB}
SEQ_K=${SEQ_K:-256}
SEQ_W=${SEQ_W:-8}
SEQ_QD=${SEQ_QD:-4}
SEQ_PATHS=${SEQ_PATHS-colocated remote}
OUT=${OUT:-/dev/null}

die() {
    echo "bench-cluster: $*" >&2
    exit 1
}

if [[ -z ${NO_BUILD:-} ]]; then
    cargo build --release -p nodekernel-cli --locked >&2
fi
NK=$PWD/target/release/nk
[[ -x $NK ]] || die "$NK is missing (run without NO_BUILD)"
command -v python3 >/dev/null 2>&1 || die "python3 not found"

TMP=$(mktemp -d)
# Servers refuse to run without a cluster token (docs/security.md): every
# server and client of this run uses this one.
export NK_TOKEN_FILE="$TMP/token"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$NK_TOKEN_FILE")
PIDS=()
META_PIDS=()
STORE_PIDS=()
META=

# Stops every server this script started: SIGTERM, then SIGKILL for any
# still there after 5 s.
stop_all() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
    META_PIDS=()
    STORE_PIDS=()
    META=
}
trap 'stop_all; rm -rf "$TMP"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Size in bytes of "16MiB", "1GiB", "4096".
bytes() {
    python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)\s*([KMGT]i?B?)?", sys.argv[1].strip(), re.I)
if not m:
    sys.exit("bad size " + sys.argv[1])
unit = (m.group(2) or "").upper()[:1]
print(int(m.group(1)) * 1024 ** " KMGT".index(unit or " "))' "$1"
}

# Waits until FILE has a line matching the sed expression SED (printing
# the captured address) while PID lives; prints the address.
address_from() {
    local file=$1 sed=$2 pid=$3 addr=
    for _ in $(seq 600); do
        addr=$(sed -n "$sed" "$file" | head -n 1)
        [[ -n $addr ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    [[ -n $addr ]] || {
        cat "$file" "$file.err" >&2
        die "no address in $file"
    }
    echo "$addr"
}

# User + system CPU time of a process, in clock ticks (0 once it is gone).
ticks_of() {
    local stat
    read -r stat <"/proc/$1/stat" 2>/dev/null || {
        echo 0
        return
    }
    stat=${stat##*) }
    # shellcheck disable=SC2086 # split the fields on purpose
    set -- $stat
    echo $((${12} + ${13}))
}
sum_ticks() {
    local t=0 pid
    for pid in "$@"; do
        t=$((t + $(ticks_of "$pid")))
    done
    echo "$t"
}
# CPU time of this shell's waited-for children (cutime + cstime).
children_ticks() {
    local stat
    read -r stat <"/proc/$$/stat"
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo $((${14} + ${15}))
}
# All CPUs' ticks and the machine's context switches: "total idle ctxt"
# (idle includes iowait).
machine_ticks() {
    local _cpu user nice system idle iowait irq softirq steal _rest
    read -r _cpu user nice system idle iowait irq softirq steal _rest </proc/stat
    echo "$((user + nice + system + idle + iowait + irq + softirq + steal)) $((idle + iowait)) $(sed -n 's/^ctxt //p' /proc/stat)"
}

# Waits (at most 60 s) until the servers have stopped using CPU: a DRAM
# store touches its whole region in the background after start-up, which
# would otherwise compete with the first measurements.
wait_idle() {
    local prev now
    prev=$(sum_ticks "${PIDS[@]}")
    for _ in $(seq 60); do
        sleep 1
        now=$(sum_ticks "${PIDS[@]}")
        ((now - prev < 5)) && break
        prev=$now
    done
}

# start_cluster PARTITIONS STORES STORE_SIZE: one `nk meta` per partition and
# STORES DRAM `nk store`s registered with all of them; sets META (the
# ordered list) once `nk status --wait` says every store is alive.
start_cluster() {
    local parts=$1 stores=$2 size=$3 i pid addr
    META=
    for ((i = 0; i < parts; i++)); do
        printf '[meta]\npartition = %d\npartitions = %d\nexpect_servers = %d\n' \
            "$i" "$parts" "$stores" >"$TMP/meta-$i.toml"
        "$NK" --config "$TMP/meta-$i.toml" meta --listen 127.0.0.1:0 \
            >"$TMP/meta-$i.log" 2>"$TMP/meta-$i.log.err" &
        pid=$!
        PIDS+=("$pid")
        META_PIDS+=("$pid")
        addr=$(address_from "$TMP/meta-$i.log" 's/^metadata server listening on \([^ ]*\)$/\1/p' "$pid")
        META=${META:+$META,}$addr
    done
    for ((i = 0; i < stores; i++)); do
        "$NK" store --meta "$META" --class 0 --medium dram --size "$size" --listen 127.0.0.1:0 \
            >"$TMP/store-$i.log" 2>"$TMP/store-$i.log.err" &
        pid=$!
        PIDS+=("$pid")
        STORE_PIDS+=("$pid")
        address_from "$TMP/store-$i.log" 's/^storage server [0-9]*: .* at \([^ ]*\)$/\1/p' "$pid" >/dev/null
    done
    "$NK" status --wait --timeout 60 --meta "$META" >"$TMP/status.log" 2>&1 || {
        cat "$TMP/status.log" >&2
        die "the cluster did not get ready"
    }
    wait_idle
}

# measure ARGS...: runs `nk bench ARGS --json` against $META and sets REPORT
# (its JSON, one line) and CPU (where the CPU time went meanwhile, as JSON).
measure() {
    local m0 m1 c0 c1 meta0 meta1 st0 st1 t0 t1 json
    read -r -a m0 <<<"$(machine_ticks)"
    c0=$(children_ticks)
    meta0=$(sum_ticks "${META_PIDS[@]}")
    st0=$(sum_ticks "${STORE_PIDS[@]}")
    t0=$(date +%s.%N)
    local meta=()
    [[ -n $META ]] && meta=(--meta "$META")
    "$NK" "${meta[@]}" bench "$@" --json >"$TMP/report.json" 2>"$TMP/bench.err" || {
        cat "$TMP/bench.err" >&2
        die "nk bench $* failed"
    }
    t1=$(date +%s.%N)
    c1=$(children_ticks)
    meta1=$(sum_ticks "${META_PIDS[@]}")
    st1=$(sum_ticks "${STORE_PIDS[@]}")
    read -r -a m1 <<<"$(machine_ticks)"
    json=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$TMP/report.json")
    REPORT=$json
    CPU=$(printf '{"all": %d, "idle": %d, "ctxt": %d, "client": %d, "meta": %d, "store": %d, "wall": %s}' \
        $((m1[0] - m0[0])) $((m1[1] - m0[1])) $((m1[2] - m0[2])) $((c1 - c0)) $((meta1 - meta0)) $((st1 - st0)) \
        "$(python3 -c 'import sys; print(float(sys.argv[2]) - float(sys.argv[1]))' "$t0" "$t1")")
    printf '{"args": "%s", "report": %s, "cpu_ticks": %s}\n' "$*" "$REPORT" "$CPU" >>"$OUT"
    echo "$REPORT" >>"$TMP/rows.jsonl"
    echo "$CPU" >>"$TMP/cpu.jsonl"
    printf '%s\t%s\n' "$ROW_KEY" "$*" >>"$TMP/keys.tsv"
    echo "  $ROW_KEY: nk bench $*: $(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
o, g = r["ops_per_sec"], r["gb_per_sec"]
print(f"{o:.0f} ops/s, {g:.2f} GB/s")' "$REPORT")" >&2
}

: >"$TMP/rows.jsonl"
: >"$TMP/cpu.jsonl"
: >"$TMP/keys.tsv"
started=$(date +%s)

echo "== metadata lookups: partitions $PARTITIONS ==" >&2
for parts in $PARTITIONS; do
    # Each partition gets a slice of the store's blocks; every directory
    # takes one block (1 MiB) for its child records: the roots and one per
    # client, twice over for room, at least 256 MiB.
    most=0
    for c in $LOOKUP_CLIENTS; do ((c > most)) && most=$c; done
    lookup_store=$((2 * (LOOKUP_ROOTS + most) + 16 * parts))
    ((lookup_store < 256)) && lookup_store=256
    start_cluster "$parts" 1 "${lookup_store}MiB"
    for c in $LOOKUP_CLIENTS; do
        ROW_KEY="lookup $parts $c"
        measure lookup -c "$c" -k "$LOOKUP_K" -w "$LOOKUP_W" --roots "$LOOKUP_ROOTS"
    done
    stop_all
done

echo "== sequential throughput: storage servers $STORES ==" >&2
op_bytes=$(bytes "$SEQ_SIZE")
for stores in $STORES; do
    # Room for the File (and the warm-up writes) spread over the stores,
    # plus the directories' record blocks.
    need=$(((SEQ_K + SEQ_W) * op_bytes))
    per=$(((need / stores + (64 << 20)) / (1 << 20)))
    start_cluster 1 "$stores" "${per}MiB"
    for path in $SEQ_PATHS; do
        flag=()
        [[ $path == remote ]] && flag=(--remote)
        ROW_KEY="write $stores $path"
        measure write -s "$SEQ_SIZE" -k "$SEQ_K" -w "$SEQ_W" "${flag[@]}"
        ROW_KEY="read $stores $path"
        measure read -s "$SEQ_SIZE" -k "$SEQ_K" -w "$SEQ_W" --qd "$SEQ_QD" "${flag[@]}"
    done
    stop_all
done
# This machine's limits for one stream, no cluster: memcpy into fresh
# memory (what a co-located write is) and one loopback TCP stream.
ROW_KEY="memcpy 0 baseline"
measure memcpy -s "$SEQ_SIZE" -k "$SEQ_K" -w "$SEQ_W"
ROW_KEY="tcp 0 baseline"
measure tcp -s 1MiB -k 4096 -w 256
elapsed=$(($(date +%s) - started))

python3 - "$TMP/keys.tsv" "$TMP/rows.jsonl" "$TMP/cpu.jsonl" "$elapsed" "$(getconf CLK_TCK)" <<'EOF'
import json, os, sys

keys = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
rows = [json.loads(l) for l in open(sys.argv[2])]
cpus = [json.loads(l) for l in open(sys.argv[3])]
elapsed = int(sys.argv[4])
hz = int(sys.argv[5])


def share(c, part):
    # Percent of all CPUs' time while the bench process ran.
    if part == "other":
        ours = c["client"] + c["meta"] + c["store"]
        v = c["all"] - c["idle"] - ours
        return f"{max(v, 0) * 100 / c['all']:.0f}%"
    return f"{c[part] * 100 / c['all']:.0f}%"


ncpu = os.cpu_count()
print(f"Machine: {ncpu} CPUs; {elapsed} s in all. CPU columns: share of all "
      f"{ncpu} CPUs' time while the `nk bench` process ran (setup included), "
      "from /proc.")
print()
print("#### Metadata lookups/s by metadata partitions")
print()
print("| partitions | nk bench | lookups/s | vs 1 partition | p50 µs | p99 µs "
      "| client CPU | metadata servers CPU | storage server CPU | other processes | idle "
      "| client CPU µs per lookup | metadata CPU µs per lookup | context switches per lookup (machine) |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
base = {}
for (key, args), r, c in zip(keys, rows, cpus):
    kind, n, extra = key.split(" ")
    if kind != "lookup":
        continue
    base.setdefault(extra, r["ops_per_sec"])
    l = r["latency_us"]
    # Ticks of 1/hz s; the whole process's time, setup included.
    per_op = lambda t: t / hz / r["ops"] * 1e6
    print(f"| {n} | `{args}` | {r['ops_per_sec']:.0f} | "
          f"{r['ops_per_sec'] / base[extra]:.2f}x | {l['p50']:.1f} | {l['p99']:.1f} | "
          f"{share(c, 'client')} | {share(c, 'meta')} | {share(c, 'store')} | "
          f"{share(c, 'other')} | {c['idle'] * 100 / c['all']:.0f}% | "
          f"{per_op(c['client']):.1f} | {per_op(c['meta']):.1f} | "
          f"{c['ctxt'] / r['ops']:.2f} |")
print()
print("#### Sequential throughput (GiB/s) by storage servers")
print()
print("| storage servers | path | op | nk bench | GiB/s | vs 1 server | p50 µs per op "
      "| client CPU | storage servers CPU | metadata server CPU | other processes | idle |")
print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
base = {}
for (key, args), r, c in zip(keys, rows, cpus):
    kind, n, path = key.split(" ")
    if kind not in ("write", "read", "memcpy", "tcp"):
        continue
    gib = r["gb_per_sec"] * 1e9 / 2**30
    base.setdefault((kind, path), gib)
    if path == "baseline":
        n, taken, vs = "–", "baseline (no cluster)", "–"
    else:
        taken = f"{path} ({r['data_path']}/{r['meta_transport']})"
        vs = f"{gib / base[(kind, path)]:.2f}x"
    print(f"| {n} | {taken} | {kind} | `{args}` | {gib:.2f} | "
          f"{vs} | {r['latency_us']['p50']:.0f} | "
          f"{share(c, 'client')} | {share(c, 'store')} | {share(c, 'meta')} | "
          f"{share(c, 'other')} | {c['idle'] * 100 / c['all']:.0f}% |")
busy = [k for (k, _), c in zip(keys, cpus)
        if (c["all"] - c["idle"] - c["client"] - c["meta"] - c["store"]) > 0.1 * c["all"]]
if busy:
    print()
    print(f"WARNING: other processes took more than 10% of the CPUs during: {', '.join(busy)}; "
          "run again on a quiet machine.")
EOF

#!/usr/bin/env bash
# Scale curves (issue #12): `nk bench` with 1, 4, 16 and 64 clients against
# clusters of 1, 2 and 4 DRAM storage servers, for getkey and putkey (4 B,
# 1 KiB, 1 MiB; co-located and --remote) and sequential reads, with Redis
# (every size) and memcached (4 B and 1 KiB) at the same concurrency in the
# same run. Prints the Markdown tables of docs/benchmarks.md and draws the
# curves.
#
#   scripts/bench-scale.sh
#
# Per store count it starts `nk meta` and that many `nk store --medium dram`
# processes (each with its own data directory under a temporary directory;
# all stopped at exit), waits until they are registered and idle, runs the
# sweep and stops them. Redis and memcached are single servers whatever the
# store count, so they are measured once per operation x size x clients:
# with the co-located rows of the 1-store pass (`nk bench --vs
# redis,memcached`, which starts and stops the peer for that row).
#
# Environment:
#   OUT=FILE        the JSON lines (default: a file in the temporary directory)
#   PNG=FILE        the plot (default docs/img/scale-curves.png)
#   QUICK=1         a smoke run: a few hundred operations per row (about 3 minutes)
#   STORES, CLIENTS the sweep (default "1 2 4" and "1 4 16 64")
#   DRAM_TOTAL      DRAM of each cluster, split over its stores (default 4GiB)
#   RUN_TIMEOUT     seconds one `nk bench` may take before it counts as failed
#   SERVER_SPIN_US  NK_POLL_SPIN_US of the meta and store processes only
#                   (default: unset, the servers' default busy-poll budget)
#   BENCH_VENV=DIR  virtualenv for matplotlib (default target/bench-venv)
#   NO_BUILD=1      use target/release/nk as it is
# Needs redis-server, redis-benchmark and memcached: installed with apt-get
# when run as root and missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BENCH_NAME=bench-scale

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "== apt-get install ${missing[*]} ==" >&2
        apt-get install -y "${missing[@]}" >&2 ||
            { apt-get update >&2 && apt-get install -y "${missing[@]}" >&2; }
    else
        echo "$BENCH_NAME: missing ${missing[*]}; install with: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

# BENCH_VENV, PY, NK, TMP, die, cpu_ticks and the cleanup at exit.
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh

PLOT_PINS=(matplotlib==3.11.2)
if [[ ! -x $PY ]]; then
    echo "== creating $BENCH_VENV ==" >&2
    python3 -m venv "$BENCH_VENV"
fi
if [[ "$(cat "$BENCH_VENV/.bench-scale-pins" 2>/dev/null)" != "${PLOT_PINS[*]}" ]]; then
    "$PY" -m pip install --quiet "${PLOT_PINS[@]}"
    echo "${PLOT_PINS[*]}" >"$BENCH_VENV/.bench-scale-pins"
fi
if [[ -z ${NO_BUILD:-} ]]; then
    echo "== building nk (release) ==" >&2
    cargo build --release --bin nk >&2
fi
[[ -x $NK ]] || die "$NK is missing (run without NO_BUILD)"

OUT=${OUT:-$TMP/scale.jsonl}
PNG=${PNG:-docs/img/scale-curves.png}
STORES=${STORES:-1 2 4}
CLIENTS=${CLIENTS:-1 4 16 64}
# Measured operations per row, all clients together (each client does
# OPS / clients, at least MIN), keys each client cycles through, and MiB read
# per sequential-read row. Sized for about 30 minutes on 2 cores.
SMALL_OPS=60000 SMALL_MIN=200 SMALL_KEYS=100
BIG_OPS=6000 BIG_MIN=30 BIG_KEYS=8
READ_MIB=2048 READ_MIN=16
DRAM_TOTAL=${DRAM_TOTAL:-4GiB}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
if [[ -n ${QUICK:-} ]]; then
    SMALL_OPS=1000 SMALL_MIN=20 SMALL_KEYS=20
    BIG_OPS=100 BIG_MIN=4 BIG_KEYS=2
    READ_MIB=128 READ_MIN=4
    DRAM_TOTAL=${DRAM_TOTAL_QUICK:-2GiB}
    RUN_TIMEOUT=${RUN_TIMEOUT_QUICK:-120}
fi
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
python3 scripts/bench_scale.py header --quick "${QUICK:-0}" \
    --commit "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo +dirty)" \
    --redis "$(redis-server --version)" --memcached "$(memcached -V)" \
    --server-spin "${SERVER_SPIN_US:-default}" --dram "$DRAM_TOTAL" >>"$OUT"
# The servers' environment (SERVER_SPIN_US).
SERVER_ENV=()
[[ -n ${SERVER_SPIN_US:-} ]] && SERVER_ENV=("NK_POLL_SPIN_US=$SERVER_SPIN_US")

CLUSTER_PIDS=()
scale_cleanup() {
    stop_cluster
    bench_cleanup
}
trap scale_cleanup EXIT

# Stops the stores, then the metadata server.
stop_cluster() {
    local i pid
    for ((i = ${#CLUSTER_PIDS[@]} - 1; i >= 0; i--)); do
        pid=${CLUSTER_PIDS[i]}
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    CLUSTER_PIDS=()
}

# start_cluster N: `nk meta` and N DRAM stores of DRAM_TOTAL / N each; sets
# META once all N are alive and the stores have prefaulted their DRAM (at
# most 60 s of waiting for the processes to go idle).
start_cluster() {
    local n=$1 dir=$TMP/cluster-$1 i alive
    local size
    size=$(($(python3 scripts/bench_scale.py mib "$DRAM_TOTAL") / n))MiB
    mkdir -p "$dir"
    env "${SERVER_ENV[@]}" "$NK" meta --listen 127.0.0.1:0 >"$dir/meta.log" 2>&1 &
    CLUSTER_PIDS=($!)
    META=
    for _ in $(seq 100); do
        META=$(sed -n 's/.*metadata server listening on \([^ ]*\).*/\1/p' "$dir/meta.log" | head -n 1)
        [[ -n $META ]] && break
        kill -0 "${CLUSTER_PIDS[0]}" 2>/dev/null || { cat "$dir/meta.log" >&2; die "nk meta exited"; }
        sleep 0.1
    done
    [[ -n $META ]] || die "nk meta printed no address"
    for ((i = 1; i <= n; i++)); do
        mkdir -p "$dir/store-$i"
        env "${SERVER_ENV[@]}" "$NK" store --meta "$META" --class 0 --medium dram --size "$size" \
            --listen 127.0.0.1:0 --data-dir "$dir/store-$i" >"$dir/store-$i.log" 2>&1 &
        CLUSTER_PIDS+=($!)
    done
    for _ in $(seq 600); do
        alive=$("$NK" status --meta "$META" --json 2>/dev/null |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["alive_servers"])' 2>/dev/null || true)
        [[ $alive == "$n" ]] && break
        for pid in "${CLUSTER_PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null || { tail -n 5 "$dir"/*.log >&2; die "a server of the cluster exited"; }
        done
        sleep 0.2
    done
    [[ $alive == "$n" ]] || die "only ${alive:-0} of $n stores registered"
    local prev now pid
    prev=0
    for pid in "${CLUSTER_PIDS[@]}"; do prev=$((prev + $(cpu_ticks "$pid"))); done
    for _ in $(seq 60); do
        sleep 1
        now=0
        for pid in "${CLUSTER_PIDS[@]}"; do now=$((now + $(cpu_ticks "$pid"))); done
        ((now - prev < 5)) && break
        prev=$now
    done
}

# per_client OPS MIN CLIENTS: operations per client.
per_client() {
    local k=$(($1 / $3))
    echo $((k > $2 ? k : $2))
}

# record STORES PATH OP SIZE CLIENTS -- NK_BENCH_ARGS...: one `nk bench
# --json` run, appended to OUT as a JSON line (with its error, if it failed
# or ran past RUN_TIMEOUT: the sweep goes on).
record() {
    local stores=$1 path=$2 op=$3 size=$4 clients=$5
    shift 6
    echo "  stores=$stores $path: nk bench $*" >&2
    local rc=0 t0 t1
    t0=$(date +%s.%N)
    # In the background, so that a TERM to this script stops it at once.
    timeout "$RUN_TIMEOUT" "$NK" bench "$@" --meta "$META" --json >"$TMP/run.json" 2>"$TMP/run.err" &
    DRIVER_PID=$!
    wait "$DRIVER_PID" || rc=$?
    DRIVER_PID=
    t1=$(date +%s.%N)
    python3 scripts/bench_scale.py line --stores "$stores" --path "$path" --op "$op" \
        --size "$size" --clients "$clients" --rc "$rc" --wall "$t0" "$t1" \
        --report "$TMP/run.json" --stderr "$TMP/run.err" >>"$OUT"
    if ((rc != 0)); then
        echo "    failed (exit $rc): $(tail -c 300 "$TMP/run.err")" >&2
    fi
}

started=$(date +%s)
for stores in $STORES; do
    echo "== $stores DRAM store(s), $DRAM_TOTAL in all ==" >&2
    start_cluster "$stores"
    for clients in $CLIENTS; do
        for size in 4 1KiB 1MiB; do
            if [[ $size == 1MiB ]]; then
                k=$(per_client "$BIG_OPS" "$BIG_MIN" "$clients") keys=$BIG_KEYS peers=redis
            else
                k=$(per_client "$SMALL_OPS" "$SMALL_MIN" "$clients") keys=$SMALL_KEYS peers=redis,memcached
            fi
            for op in getkey putkey; do
                for path in colocated remote; do
                    args=("$op" -s "$size" -c "$clients" -k "$k" -w $((k / 10)) --keys "$keys")
                    [[ $path == remote ]] && args+=(--remote)
                    # The peers once per op x size x clients (see above).
                    [[ $path == colocated && $stores == "${STORES%% *}" ]] && args+=(--vs "$peers")
                    record "$stores" "$path" "$op" "$size" "$clients" -- "${args[@]}"
                done
            done
        done
        # Sequential reads: each client reads its own File of k MiB, 1 MiB
        # per read, 4 reads in flight (the File is written before timing).
        k=$(per_client "$READ_MIB" "$READ_MIN" "$clients")
        for path in colocated remote; do
            args=(read -s 1MiB -c "$clients" -k "$k" -w 4 --qd 4)
            [[ $path == remote ]] && args+=(--remote)
            record "$stores" "$path" read 1MiB "$clients" -- "${args[@]}"
        done
    done
    stop_cluster
done
echo "== sweep took $(($(date +%s) - started)) s; JSON lines in $OUT ==" >&2

mkdir -p "$(dirname "$PNG")"
"$PY" scripts/bench_scale.py tables "$OUT" --png "$PNG"

#!/usr/bin/env bash
# Python client benchmark (issue #11): key/value latency against redis-py and
# fsspec sequential bandwidth against /dev/shm, in one run.
#
#   scripts/bench-python.sh --out results.jsonl [bench_python.py options]
#
# Starts its own cluster (`nk up`, 4 GiB of DRAM, no file tier) and its own
# Redis server on free ports, stops both at exit, and runs
# scripts/bench_python.py with a release build of the `nodekernel` module
# installed in a separate virtualenv (BENCH_VENV, default target/bench-venv;
# the project's .venv keeps its test build). Prints Markdown tables; the JSON
# lines go to --out.
#
# Environment:
#   BENCH_VENV=DIR  the benchmark's virtualenv (made if missing)
#   NO_BUILD=1      use the nk binary and the module installed already
#   QUICK=1         a smoke run (a tenth of the operations, a 256 MiB file)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BENCH_VENV=${BENCH_VENV:-$ROOT/target/bench-venv}
PY=$BENCH_VENV/bin/python
NK=$ROOT/target/release/nk
WHEELS=$ROOT/target/bench-python-wheel
PINS=(maturin==1.16.0 numpy==2.4.6 redis==8.1.0 fsspec==2026.9.0)

die() {
    echo "bench-python: $*" >&2
    exit 1
}

command -v redis-server >/dev/null 2>&1 ||
    die "redis-server not found; install it with: apt-get install -y redis-server"
command -v python3 >/dev/null 2>&1 || die "python3 not found"

if [[ ! -x $PY ]]; then
    echo "== creating $BENCH_VENV ==" >&2
    python3 -m venv "$BENCH_VENV"
fi
STAMP=$BENCH_VENV/.bench-python-pins
if [[ "$(cat "$STAMP" 2>/dev/null)" != "${PINS[*]}" ]]; then
    "$PY" -m pip install --quiet "${PINS[@]}"
    echo "${PINS[*]}" >"$STAMP"
fi

if [[ -z ${NO_BUILD:-} ]]; then
    echo "== building nk and the nodekernel wheel (release) ==" >&2
    cargo build --release -p nodekernel-cli >&2
    rm -rf "$WHEELS"
    (cd crates/py && VIRTUAL_ENV=$BENCH_VENV PATH=$BENCH_VENV/bin:$PATH \
        maturin build --quiet --release -o "$WHEELS" >&2)
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/nodekernel-*.whl
fi
[[ -x $NK ]] || die "$NK is missing (run without NO_BUILD)"

TMP=$(mktemp -d)
SHM=$(mktemp -d /dev/shm/bench-python.XXXXXX)
NK_PID=
REDIS_PID=
DRIVER_PID=
cleanup() {
    local pid
    for pid in "$DRIVER_PID" "$NK_PID" "$REDIS_PID"; do
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$TMP" "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Sum of a process's user and system CPU time, in clock ticks.
cpu_ticks() {
    local stat
    read -r stat <"/proc/$1/stat"
    stat=${stat##*) }
    # shellcheck disable=SC2086 # split the fields on purpose
    set -- $stat
    echo $((${12} + ${13}))
}

echo "== starting nk up and redis-server ==" >&2
"$NK" up --port 0 --dram 4GiB --file 0 --data-dir "$TMP/nk" >"$TMP/nk.log" 2>&1 &
NK_PID=$!
META=
for _ in $(seq 600); do
    META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$TMP/nk.log" | head -n 1)
    [[ -n $META ]] && break
    kill -0 "$NK_PID" 2>/dev/null || { cat "$TMP/nk.log" >&2; die "nk up exited"; }
    sleep 0.1
done
[[ -n $META ]] || { cat "$TMP/nk.log" >&2; die "nk up printed no metadata address"; }
"$NK" status --wait --meta "$META" >/dev/null

REDIS_PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
redis_up=
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null; then
        redis_up=1
        break
    fi
    kill -0 "$REDIS_PID" 2>/dev/null || { cat "$TMP/redis.log" >&2; die "redis-server exited"; }
    sleep 0.1
done
[[ -n $redis_up ]] || die "redis-server does not accept connections on port $REDIS_PORT"

# The DRAM tier is prefaulted in the background after start-up; wait (at
# most 60 s) until nk up is idle, so the first rows do not compete with it.
prev=$(cpu_ticks "$NK_PID")
for _ in $(seq 60); do
    sleep 1
    now=$(cpu_ticks "$NK_PID")
    ((now - prev < 5)) && break
    prev=$now
done
echo "== cluster at $META, redis at 127.0.0.1:$REDIS_PORT ==" >&2

# NumPy (the aligned buffers of the readinto rows) loads OpenBLAS, whose
# idle worker threads would only add noise on a 2-core machine.
export OPENBLAS_NUM_THREADS=1
EXTRA=()
if [[ -n ${QUICK:-} ]]; then
    EXTRA=(--scale 0.1 --file-size 256MiB)
fi
# In the background, so that a TERM to this script stops it at once.
"$PY" scripts/bench_python.py --meta "$META" --redis "127.0.0.1:$REDIS_PORT" \
    --shm-dir "$SHM" "${EXTRA[@]}" "$@" &
DRIVER_PID=$!
wait "$DRIVER_PID"

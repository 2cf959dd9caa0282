# Shared by the Python-driven benchmarks (bench-python.sh,
# bench-small-values.sh): a virtualenv with a release build of the
# `nodekernel` module, a one-process cluster (`nk up`) and a Redis server on
# free ports, stopped at exit. Source it from the repository root with ROOT
# set; it defines BENCH_VENV, PY, NK, TMP, NK_PID, META, REDIS_PID,
# REDIS_PORT and DRIVER_PID (for the caller's driver process). BENCH_NO_REDIS
# set: a benchmark without Redis, which then need not be installed.

BENCH_VENV=${BENCH_VENV:-$ROOT/target/bench-venv}
PY=$BENCH_VENV/bin/python
NK=$ROOT/target/release/nk
WHEELS=$ROOT/target/bench-python-wheel
PINS=(maturin==1.16.0 numpy==2.4.6 redis==8.1.0 fsspec==2026.9.0)

die() {
    echo "${BENCH_NAME:-bench}: $*" >&2
    exit 1
}

[[ -n ${BENCH_NO_REDIS:-} ]] || command -v redis-server >/dev/null 2>&1 ||
    die "redis-server not found; install it with: apt-get install -y redis-server"
command -v python3 >/dev/null 2>&1 || die "python3 not found"

# The virtualenv, its pinned packages, and (unless NO_BUILD) nk and the
# module built in release mode.
bench_prepare() {
    if [[ ! -x $PY ]]; then
        echo "== creating $BENCH_VENV ==" >&2
        python3 -m venv "$BENCH_VENV"
    fi
    local stamp=$BENCH_VENV/.bench-python-pins
    if [[ "$(cat "$stamp" 2>/dev/null)" != "${PINS[*]}" ]]; then
        "$PY" -m pip install --quiet "${PINS[@]}"
        echo "${PINS[*]}" >"$stamp"
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
}

TMP=$(mktemp -d)
# Servers refuse to run without a cluster token (docs/security.md): every
# server and client of this run uses this one.
export NK_TOKEN_FILE="$TMP/token"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$NK_TOKEN_FILE")
NK_PID=
REDIS_PID=
DRIVER_PID=
# Extra paths to remove at exit.
CLEANUP_PATHS=()
bench_cleanup() {
    local pid
    for pid in "$DRIVER_PID" "$NK_PID" "$REDIS_PID"; do
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$TMP" "${CLEANUP_PATHS[@]}"
}
trap bench_cleanup EXIT
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

# `nk up` with DRAM of $1, a file tier of $2 (default 0: none) and the
# further arguments (`--config FILE`, say); sets META
# once it is ready and idle (the DRAM tier is prefaulted in the background
# after start-up: wait, at most 60 s, so the first measurements do not
# compete with it).
bench_start_nk() {
    "$NK" up --port 0 --dram "$1" --file "${2:-0}" --data-dir "$TMP/nk" "${@:3}" >"$TMP/nk.log" 2>&1 &
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
    local prev now
    prev=$(cpu_ticks "$NK_PID")
    for _ in $(seq 60); do
        sleep 1
        now=$(cpu_ticks "$NK_PID")
        ((now - prev < 5)) && break
        prev=$now
    done
}

# redis-server on a free port, without persistence; sets REDIS_PORT.
bench_start_redis() {
    REDIS_PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        >"$TMP/redis.log" 2>&1 &
    REDIS_PID=$!
    local up=
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null; then
            up=1
            break
        fi
        kill -0 "$REDIS_PID" 2>/dev/null || { cat "$TMP/redis.log" >&2; die "redis-server exited"; }
        sleep 0.1
    done
    [[ -n $up ]] || die "redis-server does not accept connections on port $REDIS_PORT"
}

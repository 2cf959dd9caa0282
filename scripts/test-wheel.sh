#!/usr/bin/env bash
# Smoke test of the binary wheel as a Python user gets it:
#
#   scripts/test-wheel.sh [WHEEL]
#
# WHEEL defaults to the newest nodekernel-*.whl in the target directory's
# wheels/ (where scripts/build-wheel.sh puts it). In a fresh virtualenv in a
# temporary directory (never the repository's .venv) it installs only the
# wheel, pandas and pyarrow (at the versions crates/py/requirements-dev.txt
# pins, as constraints: the wheel's own dependency fsspec and pandas'
# numpy too), then, with nothing of the checkout on PATH or PYTHONPATH (a
# clean environment: the virtualenv's bin/, /usr/bin and /bin), checks:
#   - `import nodekernel` and its native module come from the virtualenv,
#     and `nk` on PATH is the wheel's console script (in its RECORD);
#   - the virtualenv's `nk up` starts a cluster (port 0, a temporary data
#     directory, --dram 128MiB) and is ready (`nk status --wait`);
#   - puts and gets through nodekernel: a Table of KeyValues and a File,
#     byte for byte (the File read again with `nk get`);
#   - a pandas DataFrame written and read as Parquet on nk:// (fsspec);
#   - `nk status` and `nk status --json` (parsed) show the DRAM server alive;
#   - `nk up` stops cleanly on SIGTERM;
#   - mypy's stubtest: the wheel's stubs match the wheel's module.
# Every failed check says what failed and exits non-zero; the cluster is
# stopped and the temporary directory removed on any exit. The waits are
# long: they only catch a hang. Needs network access to PyPI (or pip's
# configured index). Prints each step's time.
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD
HANG_S=300     # bounds that only catch a hang (start-up takes about a second)
DRAM=128MiB
DRAM_BYTES=$((128 << 20))

die() { echo "test-wheel: FAIL: $*" >&2; exit 1; }

WHEEL=${1:-}
if [[ -n $WHEEL && $WHEEL != /* ]]; then WHEEL=$CALLER/$WHEEL; fi
if [[ -z $WHEEL ]]; then
    dir=${CARGO_TARGET_DIR:-target}/wheels
    # shellcheck disable=SC2012 # the names are nodekernel's, no odd characters
    WHEEL=$(ls -t "$dir"/nodekernel-*.whl 2>/dev/null | head -n 1 || true)
    [[ -n $WHEEL ]] || die "no nodekernel-*.whl in $dir: run scripts/build-wheel.sh, or name the wheel"
fi
[[ -f $WHEEL && $WHEEL == *.whl ]] || die "$WHEEL is not a wheel file"
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || die "$PY not found; install CPython >= 3.9 or set PYTHON"
PINS=$ROOT/crates/py/requirements-dev.txt

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nk-test-wheel.XXXXXX")
VENV=$WORK/venv
UP_PID=
cleanup() {
    local rc=$?
    if [[ -n $UP_PID ]] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID" 2>/dev/null || true
        for _ in $(seq 1 $((HANG_S * 10))); do
            kill -0 "$UP_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
    fi
    if [[ $rc -ne 0 && -s $WORK/up.log ]]; then
        echo "--- last lines of nk up's output ($WORK/up.log) ---" >&2
        tail -n 30 "$WORK/up.log" >&2
    fi
    rm -rf "$WORK"
    if [[ $rc -ne 0 ]]; then echo "test-wheel: FAILED (exit $rc)" >&2; fi
}
trap cleanup EXIT

source scripts/lib/steps.sh

# The environment of a user of the installed wheel: a clean one, the
# virtualenv's bin/ first on PATH and nothing of the checkout.
clean_env() {
    CLEAN_ENV=(HOME="$WORK/home" PATH="$VENV/bin:/usr/bin:/bin" LANG=C.UTF-8
        TMPDIR="$WORK/tmp" NK_RUNTIME_DIR="$WORK/run")
    local v
    for v in NK_META NK_CONFIG SMOKE_DRAM_BYTES; do
        if [[ -n ${!v:-} ]]; then CLEAN_ENV+=("$v=${!v}"); fi
    done
}
# Runs a command in that environment, in the temporary directory (so not
# even the current directory is the checkout).
clean() {
    clean_env
    (cd "$WORK" && exec env -i "${CLEAN_ENV[@]}" "$@")
}
# The checks in Python, copied out of the checkout and run from there.
smoke() { clean python "$WORK/wheel_smoke.py" "$@"; }

install() {
    mkdir -p "$WORK/home" "$WORK/tmp" "$WORK/run"
    cp scripts/wheel_smoke.py crates/py/tests/stubtest_expected.txt "$WORK/"
    "$PY" -m venv "$VENV"
    # pip keeps the caller's configuration (index, certificates, proxy);
    # no Python path of the caller's leaks in.
    env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV -u PYTHONSTARTUP \
        "$VENV/bin/python" -m pip install --quiet --no-input -c "$PINS" "$WHEEL" pandas pyarrow
    env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV "$VENV/bin/python" -m pip check
    clean python -m pip list --disable-pip-version-check --format=freeze | sed 's/^/  /'
}

console_script() {
    local found
    found=$(clean sh -c 'command -v nk') || die "nk is not on the virtualenv's PATH ($VENV/bin)"
    [[ $found == "$VENV/bin/nk" ]] || die "nk on PATH is $found, not $VENV/bin/nk"
    echo "  ok: nk on PATH is $found"
    smoke package
}

start_cluster() {
    clean_env
    # A subshell that execs env, which execs nk: $! is nk up's own pid.
    (cd "$WORK" && exec env -i "${CLEAN_ENV[@]}" nk up --port 0 --dram "$DRAM" --file 0 \
        --data-dir "$WORK/data") >"$WORK/up.log" 2>&1 &
    UP_PID=$!
    local _
    for _ in $(seq 1 $((HANG_S * 10))); do
        grep -q "metadata server at" "$WORK/up.log" && break
        kill -0 "$UP_PID" 2>/dev/null || die "nk up exited before it was ready"
        sleep 0.1
    done
    NK_META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$WORK/up.log" | head -n 1)
    [[ -n $NK_META ]] || die "nk up did not report its address within $HANG_S s"
    export NK_META
    # The clients' replies may take long on a loaded machine: the bound only
    # catches a hang.
    NK_CONFIG=$WORK/client.toml
    printf '[client]\ntimeout_ms = %d\n' $((HANG_S * 1000)) >"$NK_CONFIG"
    export NK_CONFIG
    clean nk status --wait --timeout "$HANG_S" >/dev/null ||
        die "the storage servers of nk up at $NK_META did not come up"
    echo "  ok: nk up ready, metadata server at $NK_META"
}

data() {
    smoke data "$WORK"
    clean nk get /smoke/file.bin "$WORK/got.bin" || die "nk get /smoke/file.bin failed"
    cmp "$WORK/expected.bin" "$WORK/got.bin" ||
        die "nk get /smoke/file.bin differs from what Python wrote"
    echo "  ok: nk get /smoke/file.bin: the bytes Python wrote"
}

status() {
    local out
    out=$(clean nk status) || die "nk status failed: $out"
    local line
    while IFS= read -r line; do echo "  | $line"; done <<<"$out"
    echo "$out" | grep -Eq '^[0-9]+ +[^ ]+ +[0-9]+ +dram +.* alive *$' ||
        die "nk status shows no alive DRAM server"
    ! echo "$out" | grep -q DEAD || die "nk status shows a dead server"
    echo "$out" | grep -Eq '^class +name +servers' || die "nk status has no class table"
    echo "  ok: nk status: the DRAM server alive, no dead one"
    clean nk status --json >"$WORK/status.json" || die "nk status --json failed"
    SMOKE_DRAM_BYTES=$DRAM_BYTES smoke status "$WORK/status.json"
}

stop_cluster() {
    kill -TERM "$UP_PID"
    local rc=0
    wait "$UP_PID" || rc=$?
    UP_PID=
    [[ $rc -eq 0 ]] || die "nk up exited $rc on SIGTERM, not 0"
    echo "  ok: nk up stopped cleanly on SIGTERM"
}

stubs() {
    env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV \
        "$VENV/bin/python" -m pip install --quiet --no-input -c "$PINS" mypy
    smoke stubtest
}

echo "wheel: $WHEEL ($(du -h "$WHEEL" | cut -f1))"
step "fresh virtualenv: the wheel, pandas, pyarrow ($("$PY" --version))" install
step "nk is the wheel's console script" console_script
step "nk up (the virtualenv's), ready" start_cluster
step "puts and gets: Table of KeyValues, File, pandas Parquet on nk://" data
step "nk status, nk status --json" status
step "nk up stops on SIGTERM" stop_cluster
step "stubtest: the wheel's stubs match its module (mypy added)" stubs

steps_summary "test-wheel: step times"
echo "test-wheel: all checks passed for $(basename "$WHEEL")"

#!/usr/bin/env bash
# Builds NodeKernel, starts a persistent one-machine cluster (`nk up`), runs a
# short demo workload through the `nk` CLI (directories, files, a table of
# KeyValues, a bag), reads everything back, kills the cluster with SIGKILL and
# starts it again to show nothing closed was lost, takes a snapshot and
# restores it, drains the DRAM server onto the file tier, uses the same cluster from Python (the nodekernel package and
# its fsspec filesystem, in .venv) and from Java (the jars of java/), prints what it did and how long each step
# took, then stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "demo: cargo not found; install Rust (https://rustup.rs) and retry" >&2
    exit 1
fi

source scripts/lib/system-deps.sh
ensure_tools "nk mount, the FUSE file system" fusermount3=fuse3

echo "== building (release) =="
cargo build --release --bin nk
./scripts/python-env.sh --release
./scripts/java.sh --release --no-tests -q
NK="$PWD/target/release/nk"

WORK=$(mktemp -d)
LOG="$WORK/up.log"
cleanup() {
    if [[ -d "$WORK/mnt" ]]; then "$NK" umount --lazy "$WORK/mnt" 2>/dev/null || true; fi
    if [[ -n "${UP_PID:-}" ]] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# Persistent: an operation log for the namespace, and storage servers that
# keep their blocks in the data directory (docs/persistence.md).
printf '[meta]\npersistence = true\n' >"$WORK/nk.toml"

# Starts `nk up` on port $1 (0: a free one) and waits until it is ready.
start_up() {
    : >"$LOG"
    "$NK" up --config "$WORK/nk.toml" --port "$1" --dram 256MiB --file 1GiB \
        --data-dir "$WORK/data" >"$LOG" 2>"$WORK/up.err" &
    UP_PID=$!
    for _ in $(seq 1 300); do
        grep -q "metadata server at" "$LOG" 2>/dev/null && break
        if ! kill -0 "$UP_PID" 2>/dev/null; then cat "$WORK/up.err" >&2; exit 1; fi
        sleep 0.1
    done
    NK_META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$LOG" | head -n 1)
    [[ -n "$NK_META" ]] || { echo "demo: nk up did not report its address" >&2; cat "$WORK/up.err" >&2; exit 1; }
    export NK_META
    sleep 0.2 # the rest of the start-up report
    cat "$LOG"
    # Readiness is explicit: wait until the storage servers are alive.
    "$NK" status --wait --timeout 120 | head -n 2
}

echo "== starting a persistent local cluster: nk up =="
start_up 0

now() { date +%s%N; }
step() {
    local what=$1; shift
    local t0; t0=$(now)
    "$@"
    local t1; t1=$(now)
    awk -v w="$what" -v a="$t0" -v b="$t1" 'BEGIN { printf "  %-58s %8.1f ms\n", w, (b - a) / 1e6 }'
}

echo
echo "== demo workload (cluster at $NK_META) =="
head -c $((64 * 1024 * 1024)) /dev/urandom >"$WORK/input.bin"
step "mkdir -p /demo/jobs/job1" "$NK" mkdir -p /demo/jobs/job1
step "put a 64 MiB file" "$NK" put "$WORK/input.bin" /demo/jobs/job1/input.bin
step "mkdir --type table /demo/cache" "$NK" mkdir --type table /demo/cache
for i in 1 2 3 4 5; do
    step "kv put /demo/cache/key$i" "$NK" kv put "/demo/cache/key$i" "value number $i"
done
step "kv put /demo/cache/key1 again (last put wins)" "$NK" kv put /demo/cache/key1 "replaced value"
step "mkdir --type bag /demo/shuffle" "$NK" mkdir --type bag /demo/shuffle
for m in 0 1 2; do
    head -c $((300000 + m * 100000)) /dev/urandom >"$WORK/map$m.out"
    step "put map output $m into the bag" "$NK" put "$WORK/map$m.out" "/demo/shuffle/map-$m"
done

echo
echo "== reading it back =="
step "get the 64 MiB file" "$NK" get /demo/jobs/job1/input.bin "$WORK/output.bin"
cmp "$WORK/input.bin" "$WORK/output.bin" && echo "  64 MiB file: identical after the round trip"
for i in 1 2 3 4 5; do
    printf '  /demo/cache/key%s = %s\n' "$i" "$("$NK" kv get "/demo/cache/key$i")"
done
for m in 0 1 2; do
    "$NK" get "/demo/shuffle/map-$m" "$WORK/back$m" 2>/dev/null
    cmp -s "$WORK/map$m.out" "$WORK/back$m" && echo "  bag file map-$m: identical"
done
echo
echo "\$ nk ls /demo/cache";   "$NK" ls /demo/cache
echo "\$ nk ls /demo/shuffle"; "$NK" ls /demo/shuffle
echo "\$ nk stat /demo/jobs/job1/input.bin"; "$NK" stat /demo/jobs/job1/input.bin
echo "\$ nk status";           "$NK" status
echo
echo "== crash: kill -9 the whole cluster, then start it again =="
kill -KILL "$UP_PID"; wait "$UP_PID" 2>/dev/null || true
step "restart nk up on the same data directory" start_up "${NK_META##*:}"
step "get the 64 MiB file after the crash" "$NK" get /demo/jobs/job1/input.bin "$WORK/after-crash.bin"
cmp "$WORK/input.bin" "$WORK/after-crash.bin" && echo "  64 MiB file: identical after SIGKILL and restart"
printf '  /demo/cache/key1 after the crash = %s\n' "$("$NK" kv get /demo/cache/key1)"

echo
echo "== snapshot and restore =="
step "nk snapshot /demo" "$NK" snapshot /demo "$WORK/snap"
ls "$WORK/snap" | sed 's/^/  snapshot file: /'
step "nk restore into /restored" "$NK" restore "$WORK/snap" /restored
"$NK" get /restored/jobs/job1/input.bin "$WORK/restored.bin"
cmp "$WORK/input.bin" "$WORK/restored.bin" && echo "  64 MiB file: identical in the restored copy"
echo "\$ nk ls /restored/cache"; "$NK" ls /restored/cache
step "rm -r /restored" "$NK" rm -r /restored

echo
echo "== drain: empty the DRAM server while the cluster runs (its blocks move to the file tier) =="
DRAM=$("$NK" status --json | python3 -c 'import json, sys; print(next(s["addr"] for s in json.load(sys.stdin)["servers"] if s["medium"] == "dram"))')
step "nk drain $DRAM" "$NK" drain "$DRAM"
"$NK" get /demo/jobs/job1/input.bin "$WORK/drained.bin"
cmp "$WORK/input.bin" "$WORK/drained.bin" && echo "  64 MiB file: identical after the drain, now on the file tier"
step "nk drain $DRAM --cancel (it takes new blocks again)" "$NK" drain "$DRAM" --cancel

echo
echo "== the same cluster from Python (nodekernel + fsspec, .venv) =="
.venv/bin/python - <<'PY'
import fsspec
import nodekernel

with nodekernel.connect() as nk:  # finds the cluster through NK_META
    cache = nodekernel.Table(nk, "/demo/cache")
    print("  Table /demo/cache from Python:", {k: cache[k] for k in sorted(cache)})
    cache["from-python"] = b"written by Python"
fs = fsspec.filesystem("nk")
with fs.open("/demo/jobs/job1/report.txt", "wb") as f:
    f.write(b"fsspec wrote this\n")
print("  fsspec ls /demo/jobs/job1:", sorted(fs.ls("/demo/jobs/job1", detail=False)))
print("  fsspec cat report.txt:", fs.cat("/demo/jobs/job1/report.txt"))
PY

echo "== the same cluster from Java (nodekernel-client over JNI) =="
java -cp java/nodekernel-client/target/nodekernel-client-0.1.0.jar scripts/demo/JavaDemo.java

if [[ -e /dev/fuse ]] && command -v fusermount3 >/dev/null 2>&1; then
    echo
    echo "== unmodified programs on the cluster: nk mount (FUSE) =="
    mkdir "$WORK/mnt"
    step "mkdir /demo/tmp" "$NK" mkdir /demo/tmp
    step "nk mount $WORK/mnt --root /demo/tmp" "$NK" mount "$WORK/mnt" --root /demo/tmp
    seq 1 300000 | awk '{ print ($1 * 7919) % 300007 }' >"$WORK/numbers.txt"
    step "sort -n -T (spills into the mount) 300k lines" \
        sh -c "sort -n -S 256K -T '$WORK/mnt' '$WORK/numbers.txt' >'$WORK/mnt/sorted.txt'"
    step "tar the source tree onto the mount" tar -cf "$WORK/mnt/src.tar" crates
    "$NK" ls /demo/tmp | sed 's/^/  /'
    step "nk umount" "$NK" umount "$WORK/mnt"
fi
echo
step "mv /demo/jobs/job1 /demo/done" "$NK" mv /demo/jobs/job1 /demo/done
step "rm -r /demo" "$NK" rm -r /demo
echo
echo "demo finished; stopping the cluster"

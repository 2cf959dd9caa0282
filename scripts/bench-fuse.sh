#!/usr/bin/env bash
# nk mount (FUSE) against tmpfs and the machine's disk, in one run:
#   fio sequential write and read (1 MiB blocks), 4 KiB random write and read
#   (buffered; reads start from a dropped page cache: --invalidate=1), and a
#   metadata-heavy run (create + write 100 B / stat / unlink of 10,000 files).
# Prints a Markdown table with ratios (docs/benchmarks.md keeps the results).
#
#   ./scripts/bench-fuse.sh                  # SEQ_SIZE=512M RAND_SIZE=128M FILES=10000 RUNTIME=15
#   SEQ_SIZE=1G FILES=20000 ./scripts/bench-fuse.sh
#   ONLY_META=1 NK_BIN=path ./scripts/bench-fuse.sh   # the small-file rows only,
#                                                     # with another nk (no build)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/system-deps.sh
ensure_tools "the FUSE benchmark" fusermount3=fuse3 fio=fio

SEQ_SIZE=${SEQ_SIZE:-512M}
RAND_SIZE=${RAND_SIZE:-128M}
FILES=${FILES:-10000}
RUNTIME=${RUNTIME:-15}
DISK_DIR=${DISK_DIR:-/var/tmp}

if [[ -n ${NK_BIN:-} ]]; then
    NK=$(realpath "$NK_BIN")
else
    cargo build --release --bin nk --quiet
    NK="$PWD/target/release/nk"
fi
WORK=$(mktemp -d)
TMPFS=$(mktemp -d -p /dev/shm nk-bench-fuse.XXXXXX)
DISK=$(mktemp -d -p "$DISK_DIR" nk-bench-fuse.XXXXXX)
cleanup() {
    "$NK" umount --lazy "$WORK/mnt" 2>/dev/null || true
    [[ -n "${UP_PID:-}" ]] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
    rm -rf "$WORK" "$TMPFS" "$DISK"
}
trap cleanup EXIT

# A DRAM tier big enough for the fio files and a file tier behind it: every
# file takes at least one block (1 MiB), so the 10,000 small files of the
# metadata run spill into the file tier. The mount is a co-located client
# (shared-memory data path).
source scripts/lib/nk-up.sh
nk_up_start "$WORK/up.log" --dram 2GiB --file 12GiB --data-dir "$WORK/data"
"$NK" mkdir /bench
mkdir "$WORK/mnt"
"$NK" mount "$WORK/mnt" --root /bench --log "$WORK/mount.log" >/dev/null
MNT="$WORK/mnt"

fs_of() { df --output=fstype "$1" | tail -n 1; }
echo "machine: $(nproc) CPUs, $(uname -r); disk: $DISK_DIR ($(fs_of "$DISK"), $(df -h --output=source "$DISK" | tail -n 1))"
echo "fio $(fio --version), SEQ_SIZE=$SEQ_SIZE RAND_SIZE=$RAND_SIZE RUNTIME=${RUNTIME}s FILES=$FILES"

# fio_run DIR RW BS SIZE -> MB/s and IOPS ("mbps iops")
fio_run() {
    local dir=$1 rw=$2 bs=$3 size=$4
    local extra=()
    case $rw in
        read | randread) extra=(--invalidate=1) ;;
        write | randwrite) extra=(--end_fsync=1) ;;
    esac
    fio --name=nk --directory="$dir" --filename=bench.dat --rw="$rw" --bs="$bs" \
        --size="$size" --ioengine=psync --iodepth=1 --numjobs=1 \
        --time_based=0 --runtime="$RUNTIME" "${extra[@]}" \
        --output-format=json 2>/dev/null |
        python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
side = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.1f %.0f" % (side["bw_bytes"] / 1e6, side["iops"]))'
}

# Metadata-heavy: FILES small files created (100 B each), stat'ed, unlinked.
meta_run() {
    python3 - "$1" "$FILES" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
d = os.path.join(d, "meta")
os.mkdir(d)
names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
data = b"x" * 100
t = time.perf_counter()
for p in names:
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.close(fd)
t1 = time.perf_counter()
for p in names:
    os.stat(p)
t2 = time.perf_counter()
for p in names:
    os.unlink(p)
t3 = time.perf_counter()
os.rmdir(d)
print(f"{n / (t1 - t):.0f} {n / (t2 - t1):.0f} {n / (t3 - t2):.0f}")
PY
}

declare -A R
for target in tmpfs disk mount; do
    case $target in
        tmpfs) dir=$TMPFS ;;
        disk) dir=$DISK ;;
        mount) dir=$MNT ;;
    esac
    echo "== $target ($dir) ==" >&2
    if [[ -z ${ONLY_META:-} ]]; then
        R[$target.seqwrite]=$(fio_run "$dir" write 1M "$SEQ_SIZE")
        R[$target.seqread]=$(fio_run "$dir" read 1M "$SEQ_SIZE")
        rm -f "$dir/bench.dat"
        R[$target.randwrite]=$(fio_run "$dir" randwrite 4k "$RAND_SIZE")
        R[$target.randread]=$(fio_run "$dir" randread 4k "$RAND_SIZE")
        rm -f "$dir/bench.dat"
    fi
    R[$target.meta]=$(meta_run "$dir")
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
row() { # name value-index unit key
    local name=$1 i=$2 unit=$3 key=$4
    local t d m
    t=$(echo "${R[tmpfs.$key]}" | cut -d' ' -f"$i")
    d=$(echo "${R[disk.$key]}" | cut -d' ' -f"$i")
    m=$(echo "${R[mount.$key]}" | cut -d' ' -f"$i")
    printf "| %s | %s %s | %s %s | %s %s | %s | %s |\n" "$name" "$t" "$unit" "$d" "$unit" "$m" "$unit" \
        "$(ratio "$m" "$t")" "$(ratio "$m" "$d")"
}
echo
echo "| test | tmpfs | disk | nk mount | mount / tmpfs | mount / disk |"
echo "|---|---|---|---|---|---|"
if [[ -z ${ONLY_META:-} ]]; then
    row "sequential write, 1 MiB, $SEQ_SIZE" 1 MB/s seqwrite
    row "sequential read, 1 MiB, cold" 1 MB/s seqread
    row "random write, 4 KiB, $RAND_SIZE" 2 IOPS randwrite
    row "random read, 4 KiB, cold" 2 IOPS randread
fi
row "create + write 100 B" 1 files/s meta
row "stat" 2 files/s meta
row "unlink" 3 files/s meta

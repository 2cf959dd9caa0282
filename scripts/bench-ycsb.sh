#!/usr/bin/env bash
# YCSB workloads A (50/50 read/update) and B (95/5) against NodeKernel and
# Redis, through the bindings of java/nodekernel-ycsb (both store a record as
# one value of the same encoding; update is get+merge+put on both), with YCSB
# core from Maven Central. Prints a Markdown table with NodeKernel / Redis
# ratios and the targets (read p50 <= Redis's, update p50 <= 1.5x Redis's).
#
#   scripts/bench-ycsb.sh
#
# Environment:
#   RECORDS (100000)   records loaded into each store (YCSB default: 10 fields
#                      of 100 bytes, 1145 bytes encoded)
#   OPS (100000)       operations per workload run
#   THREADS ("1 4")    YCSB client threads, one run of each workload per count
#   DRAM (4GiB)        nk up's DRAM tier
#   JVM_OPTS           JVM options for every YCSB run (default -Xms1g -Xmx1g)
#   NK_RELEASE_DIR     a directory with a release `nk` and libnodekernel_jni.so
#                      to use instead of building them (cargo build --release)
#   OUT_DIR            keep YCSB's raw output there (default: removed)
#
# Starts its own `nk up` (DRAM only) and redis-server (loopback, no
# persistence) on free ports and stops both at exit. Client and servers share
# this host, so NodeKernel's client takes its default co-located path: data
# through shared memory, metadata over the Unix socket. Redis is loopback TCP.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

RECORDS=${RECORDS:-100000}
OPS=${OPS:-100000}
THREADS=${THREADS:-"1 4"}
DRAM=${DRAM:-4GiB}
read -r -a JVM <<<"${JVM_OPTS:--Xms1g -Xmx1g}"

# shellcheck source=scripts/lib/system-deps.sh
source scripts/lib/system-deps.sh
ensure_tools "YCSB benchmark" redis-server=redis-server mvn=maven java=openjdk-17-jdk-headless \
    python3=python3
for tool in redis-server mvn java python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "bench-ycsb: $tool not found" >&2; exit 1; }
done

# shellcheck source=scripts/lib/release-jni.sh
source scripts/lib/release-jni.sh
release_jni bench-ycsb

echo "== packaging java/nodekernel-ycsb (YCSB core and Jedis from Maven Central) ==" >&2
mvn -B -q -Dstyle.color=never -f java/pom.xml -pl nodekernel-ycsb -am package -DskipTests \
    -Dnk.native.dir="$REL" -Dnk.bin="$REL/nk" >&2
MOD=$ROOT/java/nodekernel-ycsb/target
CP="$MOD/nodekernel-ycsb-0.1.0.jar:$MOD/lib/*"

# The servers (and their cleanup at exit) as for the other benchmarks.
BENCH_NAME=bench-ycsb
PY=python3
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
PY=python3
NK=$REL/nk
RESULTS=${OUT_DIR:-$TMP/results}
mkdir -p "$RESULTS"

echo "== starting nk up ($DRAM of DRAM) and redis-server ==" >&2
bench_start_nk "$DRAM"
bench_start_redis
echo "== cluster at $META, redis at 127.0.0.1:$REDIS_PORT ==" >&2

# ycsb NAME PHASE THREADS WORKLOAD: one YCSB run; its report in
# $RESULTS/NAME-*.txt (stdout) and .log (stderr).
ycsb() {
    local name=$1 phase=$2 threads=$3 workload=$4 db read update out
    case $name in
        nk) db=(-db io.nodekernel.ycsb.NodeKernelClient -p "nodekernel.meta=$META") ;;
        redis) db=(-db io.nodekernel.ycsb.RedisClient -p redis.host=127.0.0.1 -p "redis.port=$REDIS_PORT") ;;
    esac
    # YCSB's workloads/workloada and workloadb (they ship in its
    # distribution tarball, not in the core jar).
    case $workload in
        a) read=0.5 update=0.5 ;;
        b) read=0.95 update=0.05 ;;
    esac
    out=$RESULTS/$name-$phase-$workload-t$threads
    echo "  $name ${phase#-} workload $workload, $threads thread(s)" >&2
    java "${JVM[@]}" -Dnodekernel.native.library="$REL/libnodekernel_jni.so" -cp "$CP" \
        site.ycsb.Client "$phase" "${db[@]}" -threads "$threads" \
        -p workload=site.ycsb.workloads.CoreWorkload \
        -p recordcount="$RECORDS" -p operationcount="$OPS" \
        -p readallfields=true -p readproportion=$read -p updateproportion=$update \
        -p scanproportion=0 -p insertproportion=0 -p requestdistribution=zipfian \
        -p measurementtype=hdrhistogram -p hdrhistogram.percentiles=50,99 \
        >"$out.txt" 2>"$out.log" &
    DRIVER_PID=$!
    wait "$DRIVER_PID" || { cat "$out.log" "$out.txt" >&2; exit 1; }
    DRIVER_PID=
    if grep -E '^\[[A-Z-]+\], Return=' "$out.txt" | grep -qv 'Return=OK'; then
        cat "$out.txt" >&2
        echo "bench-ycsb: $name $phase $workload: some operations failed" >&2
        exit 1
    fi
}

echo "== loading $RECORDS records into each ==" >&2
for name in nk redis; do
    ycsb "$name" -load 4 a
done
echo "== workloads A and B, $OPS operations each ==" >&2
for threads in $THREADS; do
    for workload in a b; do
        for name in nk redis; do
            ycsb "$name" -t "$threads" "$workload"
        done
    done
done

python3 - "$RESULTS" "$THREADS" <<'EOF'
import re
import sys

results, threads = sys.argv[1], sys.argv[2].split()
LINE = re.compile(r"^\[([\w-]+)\], ([^,]+), (\S+)$")


def report(name, workload, t):
    out = {}
    with open(f"{results}/{name}--t-{workload}-t{t}.txt") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def ratio(a, b):
    return f"{a / b:.2f}x"


print("| workload | threads | op | NodeKernel p50 / p99 µs | Redis p50 / p99 µs | p50 ratio "
      "| target | |")
print("|---|---:|---|---:|---:|---:|---|---|")
rows = []
for t in threads:
    for w in "ab":
        nk, rd = report("nk", w, t), report("redis", w, t)
        for op, limit in (("READ", 1.0), ("UPDATE", 1.5)):
            n50, n99 = nk[(op, "50thPercentileLatency(us)")], nk[(op, "99thPercentileLatency(us)")]
            r50, r99 = rd[(op, "50thPercentileLatency(us)")], rd[(op, "99thPercentileLatency(us)")]
            met = "met" if n50 <= limit * r50 else "**missed**"
            print(f"| {w.upper()} | {t} | {op.lower()} | {n50:.0f} / {n99:.0f} | {r50:.0f} / {r99:.0f} "
                  f"| {ratio(n50, r50)} | <= {limit:g}x | {met} |")
        rows.append((w, t, nk[("OVERALL", "Throughput(ops/sec)")],
                     rd[("OVERALL", "Throughput(ops/sec)")]))
print()
print("| workload | threads | NodeKernel ops/s | Redis ops/s | ratio |")
print("|---|---:|---:|---:|---:|")
for w, t, n, r in rows:
    print(f"| {w.upper()} | {t} | {n:.0f} | {r:.0f} | {ratio(n, r)} |")
EOF

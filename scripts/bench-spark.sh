#!/usr/bin/env bash
# Spark jobs on Spark's default shuffle and on NodeKernel's
# (java/nodekernel-spark), in one run (issue 19, acceptance 4): a TeraSort-style
# sortByKey of generated 100-byte records (10-byte random key, 90-byte value,
# unsigned lexicographic order) and a groupByKey of generated (int key, 96-byte
# payload) records. Prints a Markdown table of job time, map and reduce stage
# times, shuffle bytes written and read, the NodeKernel / default time ratio
# and the target (NodeKernel's job time <= the default shuffle's).
#
#   scripts/bench-spark.sh
#
# Environment:
#   SORT_GIB (4)          data sorted (generated in the tasks, no input files)
#   GROUP_GIB (2)         data grouped
#   GROUP_KEYS (100000)   distinct keys of the groupBy
#   PARTITIONS (32)       map partitions and reduce partitions of each job
#   JOBS ("sort group")   which jobs to run
#   MASTER (local[2])     Spark master (local mode: driver and executor in one JVM)
#   RUNS (1)              runs of each (job, shuffle); the table shows medians
#   SPARK_MEM (8g)        -Xmx of the Spark JVM
#   SPARK_LOCAL_DIR       spark.local.dir: where the default shuffle writes its
#                         files, and where both shuffles spill (default: a
#                         temporary directory under $TMPDIR or /tmp)
#   DRAM                  nk up's DRAM tier (default: 1.2 x the larger job's
#                         data + 1 GiB, rounded up to GiB: it holds the
#                         shuffle, NodeKernel deletes it at the end of each run)
#   FILE_TIER (0)         nk up's file tier (0: none, a shuffle that does not
#                         fit the DRAM tier fails; else overflow goes there)
#   SPARK_LINE (3.5_2.13) which Spark line's module to run (a folder
#                         java/nodekernel-spark/spark-LINE; its Spark comes
#                         from Maven Central)
#   NK_RELEASE_DIR        a directory with a release `nk` and libnodekernel_jni.so
#                         to use instead of building them (cargo build --release)
#   OUT_DIR               keep each run's output, log and results.jsonl there
#                         (default: removed)
#
# Each (job, shuffle, run) is a fresh JVM running scripts/bench/SparkShuffleBench.java
# (Kryo serializer, no UI): a small warm-up job of the same kind, then the timed
# one, whose result is validated against a second generation of the input
# (record count, order within and across partitions, checksums; outside the
# timed part); a wrong result fails the script. The order of the two shuffles
# alternates from one (job, run) to the next, and `sync` runs between JVMs so
# that one run's dirty pages are not written back during the next one.
#
# What is compared: Spark's default shuffle writes its map outputs to files in
# spark.local.dir, through the page cache (with at most 200 reduce partitions
# and no map-side combine, as here, its bypass-merge writer: a file per reduce
# partition, then concatenated), and reducers read them from there.
# NodeKernel's writes them through the JNI client into the DRAM tier of its own
# `nk up` (started on free ports, stopped at exit); client and servers share
# this host, so the data goes through shared memory and the metadata over the
# Unix socket. Spark serializes (Kryo) and compresses (lz4) the same way on
# both, and both spill to spark.local.dir when memory runs short. Here (no
# map-side combine, 32 partitions) NodeKernel's map tasks take its
# NkDirectWriter, which serializes each record straight into its partition's
# segment: no local file on the map side. Servers and JVM share the machine's
# cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SORT_GIB=${SORT_GIB:-4}
GROUP_GIB=${GROUP_GIB:-2}
GROUP_KEYS=${GROUP_KEYS:-100000}
PARTITIONS=${PARTITIONS:-32}
JOBS=${JOBS:-"sort group"}
MASTER=${MASTER:-"local[2]"}
RUNS=${RUNS:-1}
SPARK_MEM=${SPARK_MEM:-8g}
FILE_TIER=${FILE_TIER:-0}

# shellcheck source=scripts/lib/system-deps.sh
source scripts/lib/system-deps.sh
ensure_tools "Spark shuffle benchmark" mvn=maven java=openjdk-17-jdk-headless python3=python3
for tool in mvn java python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "bench-spark: $tool not found" >&2; exit 1; }
done
for job in $JOBS; do
    [[ $job == sort || $job == group ]] ||
        { echo "bench-spark: JOBS takes sort and group, not $job" >&2; exit 1; }
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "bench-spark: RUNS must be a positive integer" >&2; exit 1; }
if [[ -z ${DRAM:-} ]]; then
    DRAM=$(python3 -c 'import math, sys; print(f"{math.ceil(1.2 * max(map(float, sys.argv[1:])) + 1)}GiB")' \
        "$SORT_GIB" "$GROUP_GIB")
fi

# shellcheck source=scripts/lib/release-jni.sh
source scripts/lib/release-jni.sh
release_jni bench-spark

# The module's jar, and the class path of its compile and provided
# dependencies (the client, Spark core and what it needs) in each module's
# target/bench-classpath.txt.
SPARK_LINE=${SPARK_LINE:-3.5_2.13}
LINE_DIR=java/nodekernel-spark/spark-$SPARK_LINE
[[ -f $LINE_DIR/pom.xml ]] || { echo "bench-spark: no Spark line $SPARK_LINE ($LINE_DIR)" >&2; exit 1; }
echo "== packaging $LINE_DIR (Spark from Maven Central) ==" >&2
mvn -B -q -Dstyle.color=never -f java/pom.xml -pl "nodekernel-spark/spark-$SPARK_LINE" -am package \
    dependency:build-classpath -DskipTests -Dnk.native.dir="$REL" -Dnk.bin="$REL/nk" \
    -Dmdep.includeScope=compile -Dmdep.outputFile=target/bench-classpath.txt >&2
MOD=$ROOT/java/nodekernel-spark
LINE_TARGET=$ROOT/$LINE_DIR/target
CP="$LINE_TARGET/nodekernel-spark-$SPARK_LINE-0.1.0.jar:$(cat "$LINE_TARGET/bench-classpath.txt")"
# What spark-submit passes on Java 17: the surefire argLine of the lines' parent pom.
read -r -a OPENS <<<"$(sed -n '/<argLine>/,/<\/argLine>/p' "$MOD/pom.xml" |
    grep -Eo -- '(--add-opens=|-D)[^ <]+' | tr '\n' ' ')"
JVM=(-Xmx"$SPARK_MEM" "${OPENS[@]}"
    -Dnodekernel.native.library="$REL/libnodekernel_jni.so"
    -Dlog4j2.configurationFile="$MOD/src/test/resources/log4j2.properties")

# The server (and its cleanup at exit) as for the other benchmarks.
BENCH_NAME=bench-spark
BENCH_NO_REDIS=1
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
NK=$REL/nk
RESULTS=${OUT_DIR:-$TMP/results}
mkdir -p "$RESULTS"
: >"$RESULTS/results.jsonl"
LOCAL_DIR=${SPARK_LOCAL_DIR:-$TMP/spark-local}
mkdir -p "$LOCAL_DIR"

echo "== starting nk up ($DRAM of DRAM, file tier $FILE_TIER) ==" >&2
bench_start_nk "$DRAM" "$FILE_TIER"
echo "== cluster at $META; Spark $MASTER, -Xmx$SPARK_MEM, local dir $LOCAL_DIR ==" >&2

# spark JOB MANAGER RUN: one JVM; its RESULT line appended to results.jsonl.
spark() {
    local job=$1 manager=$2 run=$3 gib out
    case $job in
        sort) gib=$SORT_GIB ;;
        group) gib=$GROUP_GIB ;;
    esac
    out=$RESULTS/$job-$manager-r$run
    echo "  run $run: $job ($gib GiB) on the $manager shuffle" >&2
    sync
    java "${JVM[@]}" -cp "$CP" scripts/bench/SparkShuffleBench.java \
        --job "$job" --manager "$manager" --gib "$gib" --partitions "$PARTITIONS" \
        --master "$MASTER" --meta "$META" --local-dir "$LOCAL_DIR" --keys "$GROUP_KEYS" \
        >"$out.out" 2>"$out.log" &
    DRIVER_PID=$!
    wait "$DRIVER_PID" || {
        cat "$out.log" "$out.out" >&2
        echo "bench-spark: $job on the $manager shuffle failed" >&2
        exit 1
    }
    DRIVER_PID=
    grep -q '^RESULT ' "$out.out" || { cat "$out.log" >&2; echo "bench-spark: no result" >&2; exit 1; }
    sed -n 's/^RESULT //p' "$out.out" | tee -a "$RESULTS/results.jsonl" |
        python3 -c 'import json, sys; print("    %.1f s" % (json.load(sys.stdin)["job_ms"] / 1000))' >&2
}

START=$SECONDS
i=0
for run in $(seq "$RUNS"); do
    for job in $JOBS; do
        # Alternate which shuffle goes first.
        if ((i++ % 2 == 0)); then
            spark "$job" default "$run"
            spark "$job" nodekernel "$run"
        else
            spark "$job" nodekernel "$run"
            spark "$job" default "$run"
        fi
    done
done
echo "== done in $((SECONDS - START)) s ==" >&2

python3 - "$RESULTS/results.jsonl" "$RUNS" <<'EOF'
import json
import statistics
import sys

path, runs = sys.argv[1], int(sys.argv[2])
rows = [json.loads(line) for line in open(path) if line.strip()]
jobs = {}
for r in rows:
    jobs.setdefault(r["job"], {}).setdefault(r["manager"], []).append(r)


def med(rs, key):
    return statistics.median(r[key] for r in rs)


def gib(n):
    return f"{n / 2**30:.2f} GiB"


name = {"default": "default (sort)", "nodekernel": "NodeKernel"}
what = {"sort": "sortByKey (TeraSort style)", "group": "groupByKey"}
print(f"| job | size | shuffle | job time s | map stage s | reduce stage s | shuffle written "
      f"| shuffle read | NodeKernel / default | target |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
for job, by in jobs.items():
    base = med(by["default"], "job_ms")
    for m in ("default", "nodekernel"):
        rs = by[m]
        r = rs[0]
        size = f"{r['gib']:g} GiB, {r['records'] / 1e6:.1f}M records, {r['partitions']} partitions"
        t = med(rs, "job_ms")
        ratio, target = "", ""
        if m == "nodekernel":
            ratio = f"{t / base:.2f}x"
            target = "met" if t <= base else "**missed**"
        print(f"| {what[job]} | {size} | {name[m]} | {t / 1000:.1f} "
              f"| {med(rs, 'map_stage_ms') / 1000:.1f} | {med(rs, 'reduce_stage_ms') / 1000:.1f} "
              f"| {gib(med(rs, 'shuffle_bytes_written'))} | {gib(med(rs, 'shuffle_bytes_read'))} "
              f"| {ratio} | {target} |")
print()
print(f"Medians of {runs} run(s); master {rows[0]['master']}. Job time: from the first "
      "transformation to the collected result (the sort's includes sortByKey's sampling job).")
print()
print("| job | shuffle | shuffle write time s | fetch wait s | other stages s | tasks |")
print("|---|---|---:|---:|---:|---:|")
for job, by in jobs.items():
    for m in ("default", "nodekernel"):
        rs = by[m]
        print(f"| {what[job]} | {name[m]} | {med(rs, 'shuffle_write_time_ms') / 1000:.1f} "
              f"| {med(rs, 'shuffle_fetch_wait_ms') / 1000:.1f} "
              f"| {med(rs, 'other_stage_ms') / 1000:.1f} | {med(rs, 'tasks'):.0f} |")
EOF

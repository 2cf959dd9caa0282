#!/usr/bin/env bash
# The papers' Spark experiments across hosts (issue 39, acceptance 4): on the
# Spark standalone cluster of the cluster test (network-namespace hosts on
# this machine, java/nodekernel-spark/pyspark/spark_cluster.py; host 0: nk
# meta, the Spark master; hosts 0..2: a Spark worker with one 1-core
# executor each, and in the co-located layout an nk store; host 3: the
# driver, spark-submit in client mode), NodeKernel's shuffle manager against
# Spark's default sort shuffle with its external shuffle service enabled in
# every worker (as clusters run it), in the same run:
#
#   - a TeraSort-style sortByKey (10-byte random key, 90-byte value, unsigned
#     order) and a groupByKey of (int key, 96-byte payload) records, the jobs
#     of scripts/bench-spark.sh, now with map and reduce tasks on three hosts;
#   - a SQL join of two generated tables (spark.range; broadcast joins off, so
#     both sides shuffle) with an aggregation of the joined rows by group;
#   - a broadcast of a value of random bytes: NkBroadcast (in NodeKernel's
#     applications) against Spark's TorrentBroadcast (in the default's),
#     timed as each executor's first value(), the read into its JVM;
#   - placement, with NodeKernel's shuffle only: storage servers co-located
#     with the executors (hosts 0..2) against disaggregated (hosts 4..6, which
#     run no executor: every shuffle byte crosses the network twice), and
#     the DRAM tier against a file tier (co-located servers with a file
#     medium instead of DRAM).
#
# Prints Markdown tables: job times (medians, every run, map and reduce stage
# times from the event log) with the NodeKernel / default ratio and the
# targets (NodeKernel's sort and groupBy <= 0.8x the default's; NkBroadcast's
# read <= 0.5x Torrent's; disaggregated within 1.25x of co-located), a
# stage-time breakdown per job from the event logs (shuffle bytes written and
# read locally and remotely, write time, fetch wait, task run, CPU and GC
# time), and the placement table. `uptime` at start and end.
#
#   NK_RELEASE_DIR=target/release RUNS=3 scripts/bench-spark-cluster.sh
#
# Needs root and `ip netns` (the hosts are network namespaces), a JDK, the
# jars of scripts/java.sh (--release --no-tests: the client jar carries the
# native library it was built with) and the pyspark wheel's Spark
# (.venv-pyspark, made here by scripts/pyspark-env.sh when missing).
#
# Environment:
#   RUNS (1)              applications per (layout, shuffle); the tables show
#                         medians. Which shuffle goes first alternates
#   PLACEMENT_RUNS (RUNS) the same for the layouts other than co-located
#   JOBS ("sort group join broadcast")
#                         the jobs of the co-located layout, with both shuffles
#   PLACEMENTS ("colocated disaggregated file")
#                         the layouts: each a cluster of its own, started
#                         afresh; colocated is needed (it is the baseline)
#   PLACEMENT_JOBS ("sort group")
#                         the jobs of the other layouts (NodeKernel only)
#   SORT_GIB (1)          data sorted (generated in the map tasks)
#   GROUP_GIB (1)         data grouped
#   GROUP_KEYS (100000)   distinct keys of the groupBy
#   PARTITIONS (24)       map and reduce partitions of the sort and the groupBy,
#                         the partitions of the join's tables and
#                         spark.sql.shuffle.partitions (AQE on, as by default)
#   JOIN_ROWS (6000000)   rows of the join's large table (id, key, 80
#                         characters of hex)
#   JOIN_KEYS (500000)    rows of its small table (key, group, weight)
#   BROADCAST_MIB (100)   the broadcast value
#   EXECUTOR_MEM (1g)     each executor's memory (and its worker's --memory)
#   DRIVER_MEM (1g)       the driver's
#   STORE_SIZE (1GiB)     each storage server's DRAM tier (the shuffle of one
#                         job at a time: the application runs a GC between
#                         jobs, so Spark's ContextCleaner deletes the last one's)
#   FILE_STORE_SIZE (4GiB) each storage server's file tier, in the file layout
#   NK_RELEASE_DIR        a directory with a release `nk` (the servers) to use
#                         instead of building it (cargo build --release)
#   OUT_DIR               keep results.jsonl there (one record per
#                         application and job, written as each ends; the
#                         tables of one, also of a run cut short:
#                         PYTHONPATH=java/nodekernel-spark/pyspark
#                         .venv-pyspark/bin/python scripts/bench_spark_cluster.py
#                         --tables OUT_DIR/results.jsonl)
#   KEEP_LOGS             set: keep each cluster's directory (Spark's and the
#                         servers' logs, event logs) even when nothing failed
#
# Each application (one per layout, shuffle and run: fresh JVMs) is
# scripts/bench/SparkClusterBench.java with SparkShuffleBench.java, compiled
# here against the wheel's Spark and submitted with `spark-submit --class`
# (Kryo, lz4, as docs/spark.md sets NodeKernel's up): it waits for its three
# executors, runs a small warm-up of each job, then each job in a job group
# of its own, and validates every result outside the timed part (sort: count,
# order within and across partitions, checksum; groupBy: per-key counts and
# checksums; join: per-group counts and sums against arithmetic, and its hash
# sums equal across every run; broadcast: each executor's bytes' checksum).
# A wrong result, a failed task or a rerun stage fails the script. The
# default shuffle writes to each executor's spark.local.dir (this machine's
# disk, through the page cache) and its reducers fetch remote blocks from the
# other hosts' shuffle services; NodeKernel's map tasks write into the
# storage server of their own host (localPlacement) and reducers read the
# other hosts' over the network. All hosts share this machine's cores and
# memory, and the "network" is veth pairs over a bridge.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# shellcheck source=scripts/lib/system-deps.sh
source scripts/lib/system-deps.sh
ensure_tools "Spark cluster benchmark" java=openjdk-17-jdk-headless javac=openjdk-17-jdk-headless \
    python3=python3 ip=iproute2
[[ $(id -u) == 0 ]] || { echo "bench-spark-cluster: needs root (network namespaces)" >&2; exit 1; }

if [[ -n ${NK_RELEASE_DIR:-} ]]; then
    REL=$(cd "$NK_RELEASE_DIR" && pwd)
else
    echo "== building nk (release) ==" >&2
    cargo build --release -p nodekernel-cli >&2
    REL=$ROOT/target/release
fi
[[ -x $REL/nk ]] || { echo "bench-spark-cluster: no nk in $REL" >&2; exit 1; }

PY=$(scripts/pyspark-env.sh)
VERSION=$(sed -n '/<artifactId>nodekernel-parent<\/artifactId>/{n;s/.*<version>\(.*\)<\/version>.*/\1/p}' java/pom.xml)
JARS=""
for j in nodekernel-spark/spark-3.5_2.12/target/nodekernel-spark-3.5_2.12 \
    nodekernel-client/target/nodekernel-client nodekernel-hadoop/target/nodekernel-hadoop; do
    f=$ROOT/java/$j-$VERSION.jar
    [[ -f $f ]] || { echo "bench-spark-cluster: $f is missing: run scripts/java.sh --release --no-tests" >&2; exit 1; }
    JARS=${JARS:+$JARS:}$f
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench-spark-cluster.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
SPARK_HOME=$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
echo "== compiling the application against $SPARK_HOME ==" >&2
mkdir -p "$TMP/classes"
javac -nowarn -d "$TMP/classes" -cp "$SPARK_HOME/jars/*:$JARS" \
    scripts/bench/SparkShuffleBench.java scripts/bench/SparkClusterBench.java
jar cf "$TMP/bench.jar" -C "$TMP/classes" .
if [[ -n ${OUT_DIR:-} ]]; then
    mkdir -p "$OUT_DIR"
    OUT_DIR=$(cd "$OUT_DIR" && pwd)
    export OUT_DIR
fi

# The cluster (netns.Net) is torn down by the Python side, also on failure.
NK_REQUIRE_NETNS=1 PYTHONPATH=$ROOT/java/nodekernel-spark/pyspark \
    "$PY" scripts/bench_spark_cluster.py "$REL/nk" "$TMP/bench.jar" "$JARS"

#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test in the workspace, and
# a bounded run of the fuzz targets.
#
#   scripts/test.sh           everything CI runs (.ci/run runs exactly this)
#   scripts/test.sh --quick   the inner loop: fmt, the import-cycle check,
#                             clippy, every crate's unit tests (the
#                             metadata simulation among them); about a
#                             minute once target/ is warm
#
# Each step prints its time, and a table of all of them closes the run
# (also when a step fails: the table says which), with the totals of the
# core tier (run first) and the heavy one (the cluster tests, the Spark
# jobs on each Spark line and from PySpark, loom and fuzzing; see `heavy`
# below).
# Works on a fresh machine of the project's kind (Rust via rustup and CPython
# are preinstalled; the Python packages go into .venv, see python-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# A test run builds once: incremental caches would only cost disk and time.
export CARGO_INCREMENTAL=0

quick=0
for arg in "$@"; do
    case $arg in
        --quick) quick=1 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "test: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done

if ! command -v cargo >/dev/null 2>&1; then
    echo "test: cargo not found; install Rust (https://rustup.rs) and retry" >&2
    exit 1
fi
for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done

# step NAME COMMAND...: runs one step and records its time; `heavy` before
# `step` counts it in the heavy tier (the cluster and Spark suites, loom,
# fuzzing), every other step in the core one (formatting, lints, the Rust,
# Python and JVM tests). The closing table gives each tier's total.
timings=()
current=
started=$SECONDS
core_s=0
heavy_s=0
tier=core
heavy() {
    tier=heavy
    "$@"
    tier=core
}
step() {
    local name=$1 t0=$SECONDS took
    shift
    current=$name
    echo "== $name =="
    "$@"
    took=$((SECONDS - t0))
    if [[ $tier == heavy ]]; then
        heavy_s=$((heavy_s + took))
        name="$name (heavy)"
    else
        core_s=$((core_s + took))
    fi
    timings+=("$(printf '%6ds  %s' "$took" "$name")")
    echo "-- $name: $took s"
    current=
}
report() {
    local rc=$?
    echo
    echo "== step times =="
    for t in "${timings[@]}"; do echo "$t"; done
    [[ -n $current ]] && echo "  (failed: $current)"
    printf '%6ds  %s\n' "$core_s" "core: formatting, lints, Rust, Python and JVM tests"
    printf '%6ds  %s\n' "$heavy_s" "heavy: cluster tests, Spark jobs, loom, fuzzing"
    printf '%6ds  %s\n' $((SECONDS - started)) "total"
    return $rc
}
trap report EXIT

step "cargo fmt --check" cargo fmt --all -- --check
# Files inside a crate depend one way (ARCHITECTURE.md, code map).
step "no import cycles between a crate's files" python3 scripts/module-cycles.py
# The fuzz crate is a workspace of its own: a dependency added or dropped in
# the main one changes its lock file too (fuzzing would fail last, --locked).
fuzz_lock() { cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null; }
step "fuzz/Cargo.lock current" fuzz_lock
step "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
if ((quick)); then
    # Unit tests only (each crate's src/): the state machines, codecs,
    # limits and the deterministic simulation; the integration tests that
    # start clusters, the ecosystems and fuzzing are the full run's.
    step "cargo test --lib (unit tests, simulation)" cargo test --workspace --lib --locked
    exit 0
fi
doc() { RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet; }
step "cargo doc (broken links fail)" doc
system_deps() {
    source scripts/lib/system-deps.sh
    ensure_tools "network namespaces for the multi-host tests" ip=iproute2
    if ! [[ -x /usr/bin/chromium ]] && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "apt-get install chromium (the dashboard test drives it headless)"
        apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }
    fi
    # nk mount (FUSE) and the unmodified programs its tests run on the mount.
    ensure_tools "nk mount and its tests" fusermount3=fuse3 git=git sqlite3=sqlite3 cc=gcc
}
step "system packages" system_deps
# Built once, listed, and run by tier (scripts/cargo-tests.py): the core
# tier runs every test binary but the cluster tests (crates/cluster's
# tests/, which start whole clusters), the heavy tier those. The
# multi-host tests build hosts from network namespaces and the mount tests
# use FUSE (root, iproute2 and fuse3 needed): here they must run, not skip.
step "cargo test: build" scripts/cargo-tests.py build
export NK_REQUIRE_NETNS=1 NK_REQUIRE_FUSE=1
step "cargo test: run (all but the cluster tests)" scripts/cargo-tests.py run core
python_suite() {
    # The extension module the test build made (crates/py/tests/module.rs).
    ./scripts/python-env.sh --module target/debug/deps/lib_native.so
    .venv/bin/ruff check crates/py scripts java/nodekernel-spark/pyspark
    .venv/bin/ruff format --check crates/py scripts java/nodekernel-spark/pyspark
    # The tests start clusters with target/debug/nk (built by cargo test
    # above). test_dashboard.py loads the admin dashboard in
    # /usr/bin/chromium through playwright (never `playwright install`:
    # Debian's Chromium is used).
    NK_REQUIRE_BROWSER=1 .venv/bin/python -m pytest crates/py/tests -q
}
step "Python package: install into .venv, ruff, pytest" python_suite
# The JVM modules' tests with Maven (Java client, Hadoop contract suites,
# YCSB; the Spark modules' in the heavy tier) over the JNI library and the
# nk that cargo test built (crates/jni/tests/exports.rs makes it build the
# library, with the features the rest of the workspace unifies: a `cargo
# build -p nodekernel-jni` here would compile tokio and every workspace
# crate again).
jvm() { NK_BIN="$PWD/target/debug/nk" NK_JNI_DIR="$PWD/target/debug/deps" ./scripts/java.sh "$@"; }
step "JVM modules (java/): client, Hadoop, YCSB" jvm --part=core
# The heavy tier: the ecosystem and cluster suites, the model checks and
# fuzzing (these two with builds of their own).
heavy step "cluster tests (crates/cluster/tests)" scripts/cargo-tests.py run heavy
# What teams install and deploy: the release nk, the container image built
# from Debian packages with it (nk up, the demo, nk mount and every role
# in it, under runc), and the Helm chart (lint, render, the Kubernetes
# schemas, and its manifests run from that image: docs/deployment.md).
heavy step "release nk (for the image and the wheel)" cargo build --release --locked -p nodekernel-cli
heavy step "container image: build it from Debian packages, nk up, the demo, nk mount and every role in it (runc)" \
    scripts/test-image.sh --nk target/release/nk
heavy step "Helm chart: lint, render, validate against Kubernetes' schemas, run its manifests from the image" \
    scripts/test-helm.sh
# The binary wheel a Python user installs (the module in release, with the
# release nk above as its console script; maturin from .venv) and its smoke
# test in a fresh virtualenv: nk up, puts and gets, pandas on nk://,
# stubtest (docs/python.md).
heavy step "Python wheel: build (the sdist, the wheel with nk)" ./scripts/build-wheel.sh --nk target/release/nk
heavy step "Python wheel: fresh virtualenv, its nk up, puts and gets, pandas on nk://, stubtest" ./scripts/test-wheel.sh
# The Spark module's local-mode jobs (shuffle manager, NkBroadcast, a job on
# nk://) on every Spark line it is built for (java/nodekernel-spark/spark-LINE:
# Spark 3.5 on Scala 2.12 and 2.13, 4.0), a step each: each line's time.
for line_dir in java/nodekernel-spark/spark-*/; do
    line=$(basename "$line_dir")
    heavy step "JVM: Spark ${line#spark-} (local-mode Spark jobs)" jvm "--part=$line"
done
# PySpark from the pip wheel (Spark 3.5, Scala 2.12) with the jars the steps
# above built, set up as docs/spark.md says; in a virtualenv of its own
# (.venv-pyspark: the wheel is ~317 MB, pip's cache keeps it between runs).
pyspark_suite() {
    NK_BIN="$PWD/target/debug/nk" .venv-pyspark/bin/python -m pytest \
        java/nodekernel-spark/pyspark -q -p no:cacheprovider --ignore-glob='*/test_cluster.py'
}
# A Spark standalone cluster (the wheel's master and workers) over four
# network-namespace hosts, NodeKernel's meta and storage servers on them, the
# driver on its own host: every job on NodeKernel's shuffle and on Spark's
# default, with the event logs checked for map and reduce tasks on different
# hosts, and executors killed in a map and a reduce stage without a map task rerun
# (docs/spark.md, "Running on a Spark standalone cluster"). -s: it
# prints each host's roles and where each job's tasks ran.
spark_cluster() {
    NK_BIN="$PWD/target/debug/nk" .venv-pyspark/bin/python -m pytest \
        java/nodekernel-spark/pyspark/test_cluster.py -q -s -p no:cacheprovider
}
# The jars by their coordinates (io.nodekernel:ARTIFACT:0.1.0) in the local
# Maven repository, which the PySpark suite's test_packages.py resolves with
# Spark's --packages (docs/spark.md, "Maven coordinates").
heavy step "JVM: install the artifacts into the local Maven repository (java.sh --install)" jvm --install
heavy step "PySpark: install the pinned wheel into .venv-pyspark" ./scripts/pyspark-env.sh
heavy step "PySpark: DataFrame jobs on NodeKernel's shuffle and nk://" pyspark_suite
heavy step "Spark standalone cluster over netns hosts (PySpark jobs, both shuffles)" spark_cluster
# The same cluster on the other Spark lines (NK_SPARK_LINE), each with its
# own line's jar: 4.0 from the pyspark 4.0 wheel (.venv-pyspark-4.0), 3.5 for
# Scala 2.13 from a SPARK_HOME that pyspark-env.sh assembles (no wheel carries
# it: Spark's _2.13 jars from Maven Central, the 3.5 wheel's scripts and
# Python). For the time, the jobs across hosts only, and on 4.0 the executor
# kills too (Spark's scheduler there is another release; 3.5's is the same
# code on both Scalas); the fixture and the jobs check that every JVM runs
# the line's Scala.
spark_cluster_line() {
    local line=$1 tests=$2 venv=.venv-pyspark
    [[ $line == 4.0_* ]] && venv=.venv-pyspark-4.0
    NK_SPARK_LINE=$line NK_BIN="$PWD/target/debug/nk" "$venv/bin/python" -m pytest \
        java/nodekernel-spark/pyspark/test_cluster.py -q -s -p no:cacheprovider -k "$tests"
}
for line in 3.5_2.13 4.0_2.13; do
    heavy step "PySpark: Spark $line for the cluster (scripts/pyspark-env.sh $line)" \
        ./scripts/pyspark-env.sh "$line"
done
heavy step "PySpark 4.0: --packages from the local Maven repository" \
    env NK_BIN="$PWD/target/debug/nk" .venv-pyspark-4.0/bin/python -m pytest \
    java/nodekernel-spark/pyspark/test_packages.py -q -p no:cacheprovider
heavy step "Spark standalone cluster on Spark 3.5_2.13 (jobs across hosts)" \
    spark_cluster_line 3.5_2.13 "jobs_across_hosts"
heavy step "Spark standalone cluster on Spark 4.0_2.13 (jobs across hosts, executor kills)" \
    spark_cluster_line 4.0_2.13 "jobs_across_hosts or executors_killed"
# Loom: its own target directory: --cfg loom rebuilds every dependency.
heavy step "loom model check of the shared-memory protocol" \
    env RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p nodekernel-shm --release --locked --test loom
# Skipped with a notice without a nightly toolchain; NK_FUZZ_SECONDS sets
# the seconds per target (fuzz/README.md).
heavy step "fuzzing: every fuzz target for 10 s" ./scripts/fuzz.sh

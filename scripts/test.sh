#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test in the workspace, and
# a bounded run of the fuzz targets.
# Works on a fresh machine of the project's kind (Rust via rustup and CPython
# are preinstalled; the Python packages go into .venv, see python-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# A test run builds once: incremental caches would only cost disk and time.
export CARGO_INCREMENTAL=0

if ! command -v cargo >/dev/null 2>&1; then
    echo "test: cargo not found; install Rust (https://rustup.rs) and retry" >&2
    exit 1
fi
for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done

echo "== cargo fmt --check =="
cargo fmt --all -- --check
echo "== cargo clippy =="
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc (broken links fail) =="
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
source scripts/lib/system-deps.sh
ensure_tools "network namespaces for the multi-host tests" ip=iproute2
if ! [[ -x /usr/bin/chromium ]] && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "== apt-get install chromium (the dashboard test drives it headless) =="
    apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }
fi
# nk mount (FUSE) and the unmodified programs its tests run on the mount.
ensure_tools "nk mount and its tests" fusermount3=fuse3 git=git sqlite3=sqlite3 cc=gcc
echo "== cargo test =="
# The multi-host tests build hosts from network namespaces and the mount
# tests use FUSE (root, iproute2 and fuse3 needed): here they must run,
# not skip.
NK_REQUIRE_NETNS=1 NK_REQUIRE_FUSE=1 cargo test --workspace --locked
echo "== loom model check of the shared-memory protocol (about a minute) =="
# Its own target directory: --cfg loom rebuilds every dependency.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p nodekernel-shm --release --locked --test loom
echo "== fuzzing: every fuzz target for 10 s (nightly; fuzz/README.md) =="
# Skipped with a notice without a nightly toolchain; NK_FUZZ_SECONDS sets
# the seconds per target.
./scripts/fuzz.sh
echo "== Python package: build into .venv, ruff, pytest =="
./scripts/python-env.sh
.venv/bin/ruff check crates/py scripts
.venv/bin/ruff format --check crates/py scripts
# The tests start clusters with target/debug/nk (built by cargo test above).
# test_dashboard.py loads the admin dashboard in /usr/bin/chromium through
# playwright (never `playwright install`: Debian's Chromium is used).
NK_REQUIRE_BROWSER=1 .venv/bin/python -m pytest crates/py/tests -q
echo "== JVM modules: Java client, Hadoop contract suites, Spark local job, YCSB (java/) =="
# Builds the JNI library (debug) and runs every module's tests with Maven,
# against the nk that cargo test built.
NK_BIN="$PWD/target/debug/nk" ./scripts/java.sh

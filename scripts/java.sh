#!/usr/bin/env bash
# Builds the JVM modules in java/ (the Java client, the Hadoop FileSystem,
# the YCSB binding) over the JNI library, and runs their tests.
#
# Usage: scripts/java.sh [--release] [--no-tests] [maven arguments...]
#   --release   build the native library and nk in release mode (the jars
#               then carry the optimised library); default: cargo's test
#               profile (into target/debug), as the tests use
#   --no-tests  package the jars without running the tests
#
# Installs a JDK and Maven with apt-get when they are missing (as root).
# The tests start clusters with target/<profile>/nk.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debug builds use cargo's test profile: scripts/test.sh runs this after
# `cargo test`, which has built both in that profile already (a dev-profile
# build here recompiled every workspace crate: two minutes of CI).
profile=debug
cargo_flags=(--profile test)
goal=verify
mvn_args=()
for arg in "$@"; do
    case "$arg" in
        --release) profile=release; cargo_flags=(--release) ;;
        --no-tests) goal=package; mvn_args+=(-DskipTests) ;;
        *) mvn_args+=("$arg") ;;
    esac
done

source scripts/lib/system-deps.sh
ensure_tools "the JVM modules (java/)" javac=openjdk-17-jdk-headless mvn=maven

if [[ $goal == verify ]]; then
    # The Redis binding of the YCSB module is tested against a real server.
    ensure_tools "the YCSB Redis binding's tests" redis-server=redis-server
    export NK_REQUIRE_REDIS=1
    echo "== google-java-format --check (java/) =="
    scripts/java-format.sh --check
fi

echo "== native library and nk ($profile) =="
cargo build "${cargo_flags[@]}" --locked -p nodekernel-jni -p nodekernel-cli
native="$PWD/target/$profile"

echo "== Maven $goal (java/) =="
# -ntp: no download progress lines; the first run fetches the pinned
# dependencies from Maven Central into ~/.m2.
mvn -B -ntp -Dstyle.color=never -f java/pom.xml \
    -Dnk.native.dir="$native" -Dnk.bin="$native/nk" \
    "${mvn_args[@]}" "$goal"
echo "jars:"
ls java/*/target/*.jar

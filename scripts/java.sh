#!/usr/bin/env bash
# Builds the JVM modules in java/ (the Java client, the Hadoop FileSystem,
# the YCSB binding) over the JNI library, and runs their tests.
#
# Usage: scripts/java.sh [--release] [--no-tests] [--install]
#                        [--part=core|spark|spark-LINE] [maven arguments...]
#   --release   build the native library and nk in release mode (the jars
#               then carry the optimised library); default: debug, as the
#               tests use
#   --no-tests  package the jars without running the tests
#   --install   package the jars without running the tests and install every
#               module (the parent POMs too) into the local Maven repository
#               (`mvn install -DskipTests`): ~/.m2/repository, or DIR with
#               -Dmaven.repo.local=DIR among the arguments; from there Maven,
#               Gradle, sbt and Spark's --packages find them as
#               io.nodekernel:ARTIFACT:VERSION (docs/spark.md, "Maven
#               coordinates"). With --release, the installed client jar
#               carries the optimised library
#   --part      only the client, Hadoop and YCSB modules (core), or only
#               the Spark modules' tests (local-mode Spark jobs, the test
#               command's heavy tier; the modules they use are built, their
#               tests not run): spark for every Spark line, spark-LINE for
#               one, LINE being a folder java/nodekernel-spark/spark-LINE
#               (3.5_2.12, 3.5_2.13, 4.0_2.13); default: every module
#
# Installs a JDK and Maven with apt-get when they are missing (as root).
# Cargo builds into target/ (CARGO_TARGET_DIR when set: the native library
# and nk are taken from there).
# The tests start clusters with target/<profile>/nk, or with NK_BIN when set
# (an nk built already; then only the JNI library is built here). With
# NK_JNI_DIR set to the folder of a libnodekernel_jni.so built already
# (scripts/test.sh passes the one `cargo test` built, in target/debug/deps)
# and NK_BIN, nothing is built here.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
cargo_flags=()
goal=verify
part=all
mvn_args=()
for arg in "$@"; do
    case "$arg" in
        --release) profile=release; cargo_flags=(--release) ;;
        --no-tests) goal=package; mvn_args+=(-DskipTests) ;;
        --install) goal=install; mvn_args+=(-DskipTests) ;;
        --part=*) part=${arg#--part=} ;;
        *) mvn_args+=("$arg") ;;
    esac
done
# One module per Spark line, each building the same sources against its
# Spark (java/nodekernel-spark/pom.xml).
spark_lines=()
for pom in java/nodekernel-spark/spark-*/pom.xml; do
    line=${pom%/pom.xml}
    spark_lines+=("${line#java/nodekernel-spark/spark-}")
done
spark_modules() {
    local IFS=, m=()
    for line in "$@"; do m+=("nodekernel-spark/spark-$line"); done
    echo "${m[*]}"
}
spark_tests() {
    # The test pattern leaves the client's and Hadoop's tests out.
    mvn_args+=(-pl "$(spark_modules "$@")" -am "-Dtest=io/nodekernel/spark/**"
        -Dsurefire.failIfNoSpecifiedTests=false)
}
case $part in
    all) ;;
    core)
        excluded=$(spark_modules "${spark_lines[@]}")
        mvn_args+=(-pl "!nodekernel-spark,!${excluded//,/,!}") ;;
    spark) spark_tests "${spark_lines[@]}" ;;
    spark-*)
        [[ -f java/nodekernel-spark/$part/pom.xml ]] || {
            echo "java.sh: no Spark line '${part#spark-}' (java/nodekernel-spark/spark-*: ${spark_lines[*]})" >&2
            exit 2
        }
        spark_tests "${part#spark-}" ;;
    *) echo "java.sh: --part= takes core, spark or spark-LINE, not '$part'" >&2; exit 2 ;;
esac

source scripts/lib/system-deps.sh
ensure_tools "the JVM modules (java/)" javac=openjdk-17-jdk-headless mvn=maven

if [[ $goal == verify && $part != spark* ]]; then
    # The Redis binding of the YCSB module is tested against a real server.
    ensure_tools "the YCSB Redis binding's tests" redis-server=redis-server
    export NK_REQUIRE_REDIS=1
    echo "== google-java-format --check (java/) =="
    scripts/java-format.sh --check
fi

target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
native="${NK_JNI_DIR:-$target_dir/$profile}"
packages=()
if [[ -n ${NK_JNI_DIR:-} ]]; then
    [[ -f $NK_JNI_DIR/libnodekernel_jni.so ]] ||
        { echo "java.sh: no libnodekernel_jni.so in NK_JNI_DIR=$NK_JNI_DIR" >&2; exit 1; }
else
    packages+=(-p nodekernel-jni)
fi
if [[ -n ${NK_BIN:-} ]]; then
    # An nk built already (scripts/test.sh passes the one cargo test built:
    # building the CLI again here took two minutes of the test command).
    nk_bin=$NK_BIN
    [[ -x $nk_bin ]] || { echo "java.sh: NK_BIN=$nk_bin is not an executable" >&2; exit 1; }
else
    nk_bin=$target_dir/$profile/nk
    packages+=(-p nodekernel-cli)
fi
if ((${#packages[@]})); then
    echo "== cargo build ${packages[*]} ($profile) =="
    cargo build "${cargo_flags[@]}" --locked "${packages[@]}"
fi
echo "== native library: $native/libnodekernel_jni.so; nk: $nk_bin =="

echo "== Maven $goal (java/) =="
# -ntp: no download progress lines; the first run fetches the pinned
# dependencies from Maven Central into ~/.m2.
mvn -B -ntp -Dstyle.color=never -f java/pom.xml \
    -Dnk.native.dir="$native" -Dnk.bin="$nk_bin" \
    "${mvn_args[@]}" "$goal"
echo "jars:"
shopt -s nullglob
jars=(java/*/target/*.jar java/nodekernel-spark/*/target/*.jar)
printf '%s\n' "${jars[@]}"
if [[ $goal == install ]]; then
    # Where `mvn install` put them: -Dmaven.repo.local when given, else
    # Maven's default (a localRepository in settings.xml would move it).
    repo=$HOME/.m2/repository
    for arg in "${mvn_args[@]}"; do
        [[ $arg == -Dmaven.repo.local=* ]] && repo=${arg#-Dmaven.repo.local=}
    done
    echo "installed (group io.nodekernel) under $repo/io/nodekernel:"
    (cd "$repo" 2>/dev/null && find io/nodekernel -type f \( -name '*.jar' -o -name '*.pom' \) | sort) ||
        echo "  (not found there: a localRepository in ~/.m2/settings.xml?)"
fi

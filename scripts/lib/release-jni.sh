# shellcheck shell=bash
# Shared by the JVM benchmarks (bench-ycsb.sh, bench-spark.sh): sets REL to a
# directory holding a release `nk` and libnodekernel_jni.so, NK_RELEASE_DIR
# if set, else target/release after building both. Source it from the
# repository root with ROOT set; NAME is the caller's name for messages.
release_jni() {
    local name=$1
    if [[ -n ${NK_RELEASE_DIR:-} ]]; then
        REL=$(cd "$NK_RELEASE_DIR" && pwd)
    else
        echo "== building nk and the JNI library (release) ==" >&2
        cargo build --release -p nodekernel-cli -p nodekernel-jni >&2
        REL=$ROOT/target/release
    fi
    [[ -x $REL/nk && -f $REL/libnodekernel_jni.so ]] ||
        { echo "$name: no nk or libnodekernel_jni.so in $REL" >&2; exit 1; }
}

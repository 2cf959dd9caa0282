#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for a bounded time: the fuzzing step
# of the test command (scripts/test.sh), and a longer local session with
# NK_FUZZ_SECONDS. See fuzz/README.md.
#
#   scripts/fuzz.sh [TARGET...]    every target in fuzz/fuzz_targets by default
#
#   NK_FUZZ_SECONDS  seconds per target (default 10)
#   NK_FUZZ_JOBS     targets fuzzed at once (default: the number of CPUs)
#
# Needs a nightly toolchain (skipped with a notice without one), but not
# cargo-fuzz: the targets are built with the flags of
# `cargo fuzz build -s none -a` (cargo-fuzz 0.13), into the same directory,
# so `cargo +nightly fuzz run -s none -a TARGET` reuses the build. A crash
# fails the script; its input is kept under fuzz/artifacts/TARGET/ and the
# lines to reproduce it are printed.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${NK_FUZZ_SECONDS:-10}
parallel=${NK_FUZZ_JOBS:-$(nproc)}
if ! [[ $seconds =~ ^[1-9][0-9]*$ && $parallel =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz: NK_FUZZ_SECONDS and NK_FUZZ_JOBS must be positive integers" >&2
    exit 2
fi
if ! RUSTUP_AUTO_INSTALL=0 cargo +nightly --version >/dev/null 2>&1; then
    echo "skipping fuzzing: no nightly Rust toolchain (rustup toolchain install nightly)"
    exit 0
fi

if (($# > 0)); then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
fi
for t in "${targets[@]}"; do
    if ! [[ -f fuzz/fuzz_targets/$t.rs ]]; then
        echo "fuzz: no target $t in fuzz/fuzz_targets" >&2
        exit 2
    fi
done

# What `cargo fuzz build -s none -a` passes (cargo-fuzz 0.13, src/project.rs):
# coverage and comparison tracing for libFuzzer, debug assertions (so
# integer overflow panics), one codegen unit; the same string keeps the
# build shareable with cargo-fuzz.
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
flags="-Cpasses=sancov-module"
for a in sanitizer-coverage-level=4 sanitizer-coverage-inline-8bit-counters \
    sanitizer-coverage-pc-table sanitizer-coverage-trace-compares; do
    flags+=" -Cllvm-args=-$a"
done
flags+=" --cfg fuzzing -Cllvm-args=-simplifycfg-branch-fold-threshold=0"
flags+=" -Cllvm-args=-sanitizer-coverage-stack-depth -Cdebug-assertions -Ccodegen-units=1"
echo "fuzz: building ${#targets[@]} targets (release, nightly)"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
RUSTFLAGS="$flags" cargo +nightly build --manifest-path fuzz/Cargo.toml --locked --quiet \
    --target "$triple" --release --config 'profile.release.debug="line-tables-only"' "${bins[@]}"

# One target: its corpus (kept between local runs, ignored by git) grows
# from the checked-in seeds; libFuzzer writes a crashing input to the
# artifacts directory and exits non-zero.
logs=fuzz/target/fuzz-logs
mkdir -p "$logs"
for t in "${targets[@]}"; do rm -f "$logs/$t.log" "$logs/$t.rc"; done
fuzz_one() {
    local t=$1
    local corpus=fuzz/corpus/$t artifacts=fuzz/artifacts/$t
    mkdir -p "$corpus" "$artifacts"
    local inputs=("$corpus")
    if [[ -d fuzz/seeds/$t ]]; then inputs+=("fuzz/seeds/$t"); fi
    local rc=0
    "fuzz/target/$triple/release/$t" -max_total_time="$seconds" -timeout=20 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${inputs[@]}" \
        >"$logs/$t.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/$t.rc"
}

echo "fuzz: ${#targets[@]} targets, ${seconds}s each, $parallel at a time"
running=0
for t in "${targets[@]}"; do
    if ((running >= parallel)); then
        wait -n || true
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait

failed=()
for t in "${targets[@]}"; do
    rc=$(cat "$logs/$t.rc" 2>/dev/null || echo "unknown")
    touch "$logs/$t.log"
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log")
    cov=$(grep -o 'cov: [0-9]*' "$logs/$t.log" | tail -1 || true)
    if [[ $rc == 0 ]]; then
        printf 'fuzz: %-18s ok, %s runs, %s\n' "$t" "${runs:-?}" "${cov:-cov: ?}"
        continue
    fi
    failed+=("$t")
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$logs/$t.log" | tail -1)
    echo "fuzz: $t FAILED (exit $rc); from $logs/$t.log:"
    # The panic message, or libFuzzer's verdict (timeout, out of memory).
    summary=$(grep -A2 -E 'panicked at|ERROR: libFuzzer|ALARM:' "$logs/$t.log" || true)
    if [[ -z $summary ]]; then summary=$(tail -n 20 "$logs/$t.log"); fi
    printf '%s\n' "$summary" | sed -n '1,20s/^/    /p'
    if [[ -n $artifact ]]; then
        echo "fuzz: the input is $artifact; reproduce with"
        echo "    cargo +nightly fuzz run -s none -a $t $artifact"
        echo "  or, without cargo-fuzz (after this script has built it),"
        echo "    fuzz/target/$triple/release/$t $artifact"
        echo "  then fix the bug, add a regression test to the stable tests,"
        echo "  and copy the input to fuzz/seeds/$t/ (fuzz/README.md)"
    fi
done
if ((${#failed[@]} > 0)); then
    echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
    exit 1
fi

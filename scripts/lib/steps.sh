# shellcheck shell=bash
# The step timer of the scripts that build and test what users install
# (build-image.sh, test-image.sh, build-wheel.sh, test-wheel.sh,
# test-helm.sh). Source it; then
#   step NAME COMMAND...   runs one step: "== NAME ==" before it, "-- NAME:
#                          T s" after it, and records the time
#   steps_summary [TITLE]  prints every recorded step's time and the total
#                          since this file was sourced
# (scripts/test.sh keeps its own, which also tallies the tiers.)
STEPS_T0=$(date +%s.%N)
STEPS=()
steps_now() { date +%s.%N; }
step() {
    local name=$1 t0 took
    shift
    echo "== $name =="
    t0=$(steps_now)
    "$@"
    took=$(awk -v a="$t0" -v b="$(steps_now)" 'BEGIN { printf "%.1f", b - a }')
    echo "-- $name: $took s"
    STEPS+=("$(printf '%8s s  %s' "$took" "$name")")
}
steps_summary() {
    local t
    echo
    echo "== ${1:-step times} =="
    for t in "${STEPS[@]}"; do echo "$t"; done
    awk -v a="$STEPS_T0" -v b="$(steps_now)" 'BEGIN { printf "%8.1f s  total\n", b - a }'
}

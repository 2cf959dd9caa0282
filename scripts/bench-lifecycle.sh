#!/usr/bin/env bash
# What lifecycle bookkeeping costs (issue 41, acceptance 5), in one run:
#
# 1. Quota accounting and TTL bookkeeping on create, put and delete: each
#    `nk bench` mode plain, and with every node carrying a TTL (--ttl 1h,
#    from its root's child TTL) under a quota root (--quota), alternated
#    ROUNDS (default 7) times; the medians of p50 (1 client) and
#    throughput (4 clients) and their ratios. Target: within noise, at
#    most 5% worse.
# 2. Expiry of a million-node subtree (`nk bench expire`): lookups of two
#    other clients before and while it is removed. Target: their p99 within
#    2x of before.
#
#   scripts/bench-lifecycle.sh [--json-out FILE]   # prints Markdown tables
#
# Starts its own cluster (`nk up`, 4 GiB of DRAM, no file tier), stops it at
# exit. NO_BUILD=1 reuses the release build; ROUNDS (default 7), COUNT
# (operations per client, default 20000) and EXPIRE_NODES (default
# 1000000) change the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BENCH_NAME=bench-lifecycle
BENCH_NO_REDIS=1
JSON_OUT=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --json-out) JSON_OUT=$2; shift 2 ;;
        *) echo "usage: $0 [--json-out FILE]" >&2; exit 2 ;;
    esac
done
if [[ -z ${NO_BUILD:-} ]]; then
    cargo build --release -p nodekernel-cli >&2
fi
# shellcheck source=scripts/lib/bench-servers.sh
source scripts/lib/bench-servers.sh
bench_start_nk 4GiB
export NK_META=$META
ROUNDS=${ROUNDS:-7}
COUNT=${COUNT:-20000}
EXPIRE_NODES=${EXPIRE_NODES:-1000000}
RESULTS=$TMP/results.jsonl
: >"$RESULTS"

# run LABEL ARGS...: one `nk bench --json` run, its report tagged LABEL.
run() {
    local label=$1
    shift
    "$NK" bench "$@" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
r["label"] = sys.argv[1]
print(json.dumps(r))' "$label" >>"$RESULTS"
}

echo "== create, put, delete: plain against --ttl 1h --quota, $ROUNDS rounds ==" >&2
for round in $(seq "$ROUNDS"); do
    echo "   round $round" >&2
    for mode in create putkey delete; do
        extra=()
        [[ $mode == putkey ]] && extra=(--new-keys -s 100)
        for clients in 1 4; do
            # Alternate which goes first, so a drift in the machine does
            # not favour one.
            if ((round % 2)); then order=(plain lifecycle); else order=(lifecycle plain); fi
            for cfg in "${order[@]}"; do
                flags=()
                [[ $cfg == lifecycle ]] && flags=(--ttl 1h --quota)
                run "$mode/$clients/$cfg" "$mode" -c "$clients" -k "$COUNT" -w 1000 \
                    "${extra[@]}" "${flags[@]}"
            done
        done
    done
done

echo "== expiry of a subtree of $EXPIRE_NODES Files ==" >&2
"$NK" bench expire -k "$EXPIRE_NODES" -c 2 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
r["label"] = "expire"
print(json.dumps(r))' >>"$RESULTS"

[[ -n $JSON_OUT ]] && cp "$RESULTS" "$JSON_OUT"
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
def med(label, f):
    return statistics.median(f(r) for r in by[label])
def spread(label, f):
    v = [f(r) for r in by[label]]
    return (max(v) - min(v)) / statistics.median(v)
print("| operation | plain | TTL + quota | ratio | spread of plain runs | target (≤ 1.05×) |")
print("|---|---:|---:|---:|---:|---|")
names = {"create": "create (empty File)", "putkey": "put (new key, 100 B)", "delete": "delete (File)"}
for mode in ["create", "putkey", "delete"]:
    p50 = lambda r: r["latency_us"]["p50"]
    tput = lambda r: r["ops_per_sec"]
    a, b = med(f"{mode}/1/plain", p50), med(f"{mode}/1/lifecycle", p50)
    ratio = b / a
    print(f"| {names[mode]}, p50, 1 client | {a:.1f} µs | {b:.1f} µs | {ratio:.3f}× "
          f"| {spread(f'{mode}/1/plain', p50):.1%} | {'met' if ratio <= 1.05 else 'missed'} |")
    a, b = med(f"{mode}/4/plain", tput), med(f"{mode}/4/lifecycle", tput)
    ratio = a / b
    print(f"| {names[mode]}, throughput, 4 clients | {a:,.0f}/s | {b:,.0f}/s | {ratio:.3f}× "
          f"(plain / lifecycle) | {spread(f'{mode}/4/plain', tput):.1%} | {'met' if ratio <= 1.05 else 'missed'} |")
[e] = by["expire"]
print()
print(f"Expiry of {e['nodes']:,} Files in {e['directories']:,} Directories "
      f"(made at {e['creates_per_sec']:,.0f} creates/s): gone {e['gone_after_seconds']:.3f} s, "
      f"reaped {e['reaped_after_seconds']:.2f} s after the expire call.")
print()
print("| lookups of 2 other clients | lookups/s | p50 | p99 | p99.9 | max |")
print("|---|---:|---:|---:|---:|---:|")
for phase in ["before", "during"]:
    p = e[phase]
    l = p["latency_us"]
    print(f"| {phase} ({p['seconds']:.1f} s) | {p['ops_per_sec']:,.0f} | {l['p50']:.1f} µs | "
          f"{l['p99']:.1f} µs | {l['p999']:.1f} µs | {l['max']:.0f} µs |")
met = "met" if e["p99_ratio"] <= 2 else "missed"
print(f"| during / before | {e['throughput_ratio']:.2f}× | {e['p50_ratio']:.2f}× | "
      f"{e['p99_ratio']:.2f}× ({met}, target ≤ 2×) | | |")
PY

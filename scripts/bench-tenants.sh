#!/usr/bin/env bash
# What a tenant costs (issue 41, `docs/security.md`, *Tenants*): the same
# `nk bench` modes as a member (the cluster token), as a member without
# shared memory (`[client] shared_memory = false`: blocks over the socket,
# as a tenant's always are), and as a tenant (its own token, its root
# mapped to /), in turn, ROUNDS (default 5) times against one cluster; the
# medians of p50 (1 client) and throughput (4 clients) and their ratios.
# Tenant against the member without shared memory is the view's own cost
# (paths mapped into the root, node ids checked against it) and, for
# puts, the usual two exchanges (no puts reserved ahead of their keys).
#
#   scripts/bench-tenants.sh [--json-out FILE]   # prints a Markdown table
#
# Starts its own cluster (`nk up`, 4 GiB of DRAM, no file tier, one tenant
# rooted at /tenants/bench), stops it at exit. NO_BUILD=1 reuses the
# release build; ROUNDS and COUNT (operations per client, default 20000)
# change the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BENCH_NAME=bench-tenants
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
"$NK" token new "$TMP/tenant.token" >/dev/null
printf '[client]\nshared_memory = false\n' >"$TMP/socket.toml"
cat >"$TMP/tenants.toml" <<TOML
[[security.tenant]]
name = "bench"
token_file = "$TMP/tenant.token"
root = "/tenants/bench"
rights = ["read", "write"]
TOML
bench_start_nk 4GiB 0 --config "$TMP/tenants.toml"
export NK_META=$META
ROUNDS=${ROUNDS:-5}
COUNT=${COUNT:-20000}
RESULTS=$TMP/results.jsonl
: >"$RESULTS"

# run LABEL WHO ARGS...: one `nk bench --json` run as WHO (member, socket:
# a member without shared memory, or tenant), its report tagged LABEL.
run() {
    local label=$1 who=$2
    shift 2
    local env=()
    [[ $who == socket ]] && env=(NK_CONFIG="$TMP/socket.toml")
    [[ $who == tenant ]] && env=(NK_TOKEN_FILE="$TMP/tenant.token")
    env "${env[@]}" "$NK" bench "$@" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
r["label"] = sys.argv[1]
print(json.dumps(r))' "$label" >>"$RESULTS"
}

echo "== create, lookup, put: member, member without shared memory, tenant; $ROUNDS rounds ==" >&2
for round in $(seq "$ROUNDS"); do
    echo "   round $round" >&2
    for mode in create lookup putkey; do
        extra=()
        [[ $mode == putkey ]] && extra=(--new-keys -s 100)
        for clients in 1 4; do
            # Alternate which goes first, so a drift in the machine does
            # not favour one.
            case $((round % 3)) in
                0) order=(member socket tenant) ;;
                1) order=(socket tenant member) ;;
                *) order=(tenant member socket) ;;
            esac
            for who in "${order[@]}"; do
                run "$mode/$clients/$who" "$who" "$mode" -c "$clients" -k "$COUNT" -w 1000 \
                    "${extra[@]}"
            done
        done
    done
done

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
print("| operation | member | member, no shared memory | tenant | tenant / member "
      "| tenant / member without shared memory | spread of member runs |")
print("|---|---:|---:|---:|---:|---:|---:|")
names = {"create": "create (empty File)", "lookup": "lookup (File)", "putkey": "put (new key, 100 B)"}
for mode in ["create", "lookup", "putkey"]:
    for clients, what, f, fmt, worse in [
        (1, "p50, 1 client", lambda r: r["latency_us"]["p50"], "{:.1f} µs", lambda a, b: b / a),
        (4, "throughput, 4 clients", lambda r: r["ops_per_sec"], "{:,.0f}/s", lambda a, b: a / b),
    ]:
        m, s, t = (med(f"{mode}/{clients}/{w}", f) for w in ["member", "socket", "tenant"])
        print(f"| {names[mode]}, {what} | {fmt.format(m)} | {fmt.format(s)} | {fmt.format(t)} "
              f"| {worse(m, t):.3f}× | {worse(s, t):.3f}× "
              f"| {spread(f'{mode}/{clients}/member', f):.1%} |")
PY

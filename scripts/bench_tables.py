"""Turns the JSON lines of scripts/bench-compare.sh into the markdown tables
of docs/benchmarks.md, marking every product target met or missed."""

import json
import sys

rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["tag"]] = r["report"]


def mark(ok):
    return "met" if ok else "**missed**"


def taken(r):
    """The paths the run took, as nk bench reported them."""
    return f"{r.get('data_path', '?')} / {r.get('meta_transport', '?')}"


print("### Key/value latency against Redis (p50, microseconds)\n")
print(
    "| op | path | taken (data / metadata) | size | clients | NodeKernel p50 | Redis p50 | ratio | NodeKernel ops/s | Redis ops/s | target | |"
)
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
for op in ["getkey", "putkey"]:
    for path in ["colocated", "remote"]:
        for size in ["4", "1KiB", "64KiB", "1MiB", "16MiB"]:
            for c in [1, 16]:
                r = rows.get(f"{op} {path} {size} c{c}")
                if not r:
                    continue
                p = r["peer"]
                ratio = p["p50_ratio"]
                small = size in ("4", "1KiB")
                if op == "getkey":
                    target, ok = ("<= 1x", ratio <= 1.0) if small else ("<= 0.5x", ratio <= 0.5)
                else:
                    target, ok = ("<= 1.5x", ratio <= 1.5) if small else ("< 1x", ratio < 1.0)
                if c != 1:
                    target, ok = ("(1-client target)", None)
                status = "" if ok is None else mark(ok)
                print(
                    f"| {op} | {path} | {taken(r)} | {size} | {c} | {r['latency_us']['p50']:.1f} | {p['p50_us']:.1f} | "
                    f"{ratio:.2f}x | {r['ops_per_sec']:.0f} | {p['ops_per_sec']:.0f} | {target} | {status} |"
                )

print("\n### Sequential bandwidth of one client (4 GiB file, 16 MiB operations)\n")
mem = rows.get("memcpy", {}).get("gb_per_sec", 0)
tcp = rows.get("tcp", {}).get("gb_per_sec", 0)
print(
    f"Baselines in the same run: memcpy {mem:.2f} GB/s, one loopback TCP stream {tcp:.2f} GB/s.\n"
)
print("| op | path | taken (data / metadata) | GB/s | baseline | share | target | |")
print("|---|---|---|---:|---:|---:|---|---|")
for op in ["write", "read"]:
    for path, base, name in [("colocated", mem, "memcpy"), ("remote", tcp, "TCP")]:
        r = rows.get(f"{op} {path}")
        if not r or not base:
            continue
        share = r["gb_per_sec"] / base
        print(
            f"| {op} | {path} | {taken(r)} | {r['gb_per_sec']:.2f} | {name} {base:.2f} | {share:.0%} | >= 80% | {mark(share >= 0.8)} |"
        )

r = rows.get("lookup c16")
if r:
    p = r["peer"]
    print("\n### Metadata throughput, 16 clients\n")
    print("| metadata over | NodeKernel lookups/s | Redis GETs/s | ratio | target | |")
    print("|---|---:|---:|---:|---|---|")
    ratio = p["throughput_ratio"]
    print(
        f"| {r.get('meta_transport', '?')} | {r['ops_per_sec']:.0f} | {p['ops_per_sec']:.0f} | {ratio:.2f}x | >= 1x | {mark(ratio >= 1.0)} |"
    )

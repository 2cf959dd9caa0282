"""Bulk load from Python (issue 38, acceptance 5), driven by
scripts/bench-python-load.sh.

Loads N values of SIZE bytes from one Python process, timed from the first
call to the last reply: NodeKernel `Client.put_many` (batches of --batch
items, --in-flight puts outstanding) into a Table, against redis-py
pipelined SETs (batches of --redis-batch commands, no MULTI). Each run loads
both, Redis first in odd runs and NodeKernel first in even ones, into a
fresh Table and a flushed Redis; the values are made before the clock
starts (a pool of distinct random values, cycled), the keys and the items
inside the timed loop, as a loader would. Prints one line per run and a
Markdown table with the ratio (NodeKernel's time over Redis's: the target
is at most 1.5) and the memory each used after its load.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

import redis

import nodekernel

TARGET = 1.5


def used_bytes(c: nodekernel.Client) -> int:
    return sum(s["used_bytes"] for s in c.status()["servers"])


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def load_nk(c, table: str, n: int, pool: list[bytes], batch: int, in_flight: int) -> float:
    m = len(pool)
    gc.disable()
    try:
        start = time.perf_counter()
        for lo in range(0, n, batch):
            c.put_many(
                [(f"{table}/k{i}", pool[i % m]) for i in range(lo, min(lo + batch, n))],
                in_flight=in_flight,
            )
        return time.perf_counter() - start
    finally:
        gc.enable()


def load_redis(r, run: int, n: int, pool: list[bytes], batch: int) -> float:
    m = len(pool)
    pipe = r.pipeline(transaction=False)
    gc.disable()
    try:
        start = time.perf_counter()
        for lo in range(0, n, batch):
            for i in range(lo, min(lo + batch, n)):
                pipe.set(f"r{run}:k{i}", pool[i % m])
            pipe.execute()
        return time.perf_counter() - start
    finally:
        gc.enable()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meta", required=True)
    ap.add_argument("--redis", required=True, help="host:port")
    ap.add_argument("--nk-pid", type=int, default=0, help="for the RSS of nk up")
    ap.add_argument("--redis-pid", type=int, default=0)
    ap.add_argument("-n", type=int, default=1_000_000, help="values per load")
    ap.add_argument("--size", type=int, default=100, help="bytes per value")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=10_000, help="items per put_many")
    ap.add_argument("--in-flight", type=int, default=64, help="put_many's in_flight")
    ap.add_argument("--redis-batch", type=int, default=1_000, help="SETs per pipeline")
    ap.add_argument(
        "--enumerable",
        action="store_true",
        help="an enumerable Table (default: non-enumerable, the fastest correct choice "
        "for a key/value load that is never listed)",
    )
    ap.add_argument("--out", help="JSON lines, one per run")
    args = ap.parse_args()

    host, port = args.redis.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port))
    c = nodekernel.connect(args.meta)
    rng = __import__("random").Random(38)
    pool = [rng.randbytes(args.size) for _ in range(4096)]
    table_kind = "enumerable" if args.enumerable else "non-enumerable"
    print(
        f"# {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, redis-py {redis.__version__}; "
        f"{args.n} values of {args.size} B; put_many batches of {args.batch}, "
        f"in_flight {args.in_flight}, a {table_kind} Table; "
        f"Redis pipelines of {args.redis_batch}",
        flush=True,
    )
    out = open(args.out, "w", encoding="utf-8") if args.out else None
    rows = []
    for run in range(1, args.runs + 1):
        table = f"/load{run}"
        c.mkdir(table, type="table", enumerable=args.enumerable)
        r.flushall()
        nk_before = used_bytes(c)
        redis_before = r.info("memory")["used_memory"]
        t = {}
        for system in ("redis", "nk") if run % 2 else ("nk", "redis"):
            if system == "nk":
                t["nk"] = load_nk(c, table, args.n, pool, args.batch, args.in_flight)
            else:
                t["redis"] = load_redis(r, run, args.n, pool, args.redis_batch)
        # Spot checks: the last value of each, and a count from Redis.
        last = args.n - 1
        assert c.get(f"{table}/k{last}") == pool[last % len(pool)]
        assert r.get(f"r{run}:k{last}") == pool[last % len(pool)]
        assert r.dbsize() == args.n
        mem = r.info("memory")
        row = {
            "run": run,
            "n": args.n,
            "size": args.size,
            "table": table_kind,
            "batch": args.batch,
            "in_flight": args.in_flight,
            "redis_batch": args.redis_batch,
            "nk_s": t["nk"],
            "redis_s": t["redis"],
            "ratio": t["nk"] / t["redis"],
            "nk_used_bytes": used_bytes(c) - nk_before,
            "nk_rss": rss_bytes(args.nk_pid) if args.nk_pid else None,
            "redis_used_memory": mem["used_memory"] - redis_before,
            "redis_rss": mem["used_memory_rss"],
        }
        rows.append(row)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        print(
            f"run {run}: nk {t['nk']:.2f} s ({args.n / t['nk']:,.0f}/s), "
            f"redis {t['redis']:.2f} s ({args.n / t['redis']:,.0f}/s), "
            f"ratio {row['ratio']:.2f}",
            flush=True,
        )
        # Keep the cluster's memory for the next run; Redis is flushed.
        try:
            c.delete(table, recursive=True)
        except nodekernel.Error as e:
            print(f"  (could not delete {table}: {e})", file=sys.stderr)

    mib = 1 << 20
    print()
    print(
        "| run | NodeKernel put_many (s) | Redis pipelined SET (s) | ratio | target | "
        "NodeKernel used (MiB) | nk up RSS (MiB) | Redis used_memory (MiB) | Redis RSS (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        rss = f"{row['nk_rss'] / mib:.0f}" if row["nk_rss"] else "-"
        print(
            f"| {row['run']} | {row['nk_s']:.2f} | {row['redis_s']:.2f} | {row['ratio']:.2f} | "
            f"{'met' if row['ratio'] <= TARGET else 'missed'} (≤ {TARGET}) | "
            f"{row['nk_used_bytes'] / mib:.0f} | {rss} | "
            f"{row['redis_used_memory'] / mib:.0f} | {row['redis_rss'] / mib:.0f} |"
        )
    med = statistics.median(row["ratio"] for row in rows)
    print(f"\nmedian ratio {med:.2f}: {'met' if med <= TARGET else 'missed'} (target ≤ {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

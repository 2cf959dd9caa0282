"""Memory per small value (issue #12): NodeKernel against Redis.

Loads N KeyValues of each size into a running cluster (through the asyncio
client) and the same N keys into a Redis server, then compares memory:

* NodeKernel: the private resident memory of the `nk up` process (the
  metadata server's state and the servers' own heap: RssAnon) plus the DRAM
  class actually used (used blocks x block size, from `status`). The DRAM
  region is shared memory, prefaulted at start, so its resident size says
  nothing about use.
* Redis: the resident memory of redis-server (VmRSS), which is what Redis
  itself reports as used_memory_rss.

Both are measured before and after each load; the table shows the memory
after the load and the growth per value. Run it through
scripts/bench-small-values.sh, which starts both servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, Optional


def status_field(pid: int, field: str) -> int:
    """A `kB` field of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def dram_used(c: Any) -> int:
    st = await c.status()
    return sum(s["used_bytes"] for s in st["servers"] if s["class"] == 0)


async def nk_memory(c: Any, pid: int) -> dict:
    anon = status_field(pid, "RssAnon")
    dram = await dram_used(c)
    return {"anon": anon, "dram": dram, "total": anon + dram}


async def load_nk(c: Any, table: str, n: int, value: bytes, inflight: int) -> float:
    start = time.perf_counter()
    sem = asyncio.Semaphore(inflight)

    async def one(i: int) -> None:
        async with sem:
            await c.put(f"{table}/k{i:07d}", value)

    chunk = 20_000
    for base in range(0, n, chunk):
        await asyncio.gather(*(one(i) for i in range(base, min(n, base + chunk))))
        progress(f"  nk {table}: {min(n, base + chunk)}/{n}")
    return time.perf_counter() - start


def load_redis(r: Any, prefix: str, n: int, value: bytes) -> float:
    start = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"{prefix}:k{i:07d}", value)
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    return time.perf_counter() - start


async def run(args: argparse.Namespace) -> list[dict]:
    import redis

    from nodekernel import aio

    c = await aio.connect(args.meta)
    host, port = args.redis.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port))
    rows = []
    for size in args.sizes:
        for enumerable in args.enumerable:
            value = bytes((i * 31 + size) % 251 for i in range(size))
            table = f"/mem-{size}-{'enum' if enumerable else 'plain'}"
            await c.mkdir(table, type="table", enumerable=enumerable)
            r.flushall()
            time.sleep(0.5)
            nk0 = await nk_memory(c, args.nk_pid)
            rd0 = status_field(args.redis_pid, "VmRSS")
            progress(f"== {args.count} values of {size} B, enumerable={enumerable} ==")
            nk_s = await load_nk(c, table, args.count, value, args.inflight)
            rd_s = load_redis(r, table, args.count, value)
            time.sleep(0.5)
            nk1 = await nk_memory(c, args.nk_pid)
            rd1 = status_field(args.redis_pid, "VmRSS")
            sample = await c.get(f"{table}/k{args.count - 1:07d}")
            assert sample == value, "the last value reads back"
            row = {
                "size": size,
                "count": args.count,
                "enumerable": enumerable,
                "nk_before": nk0,
                "nk_after": nk1,
                "redis_before": rd0,
                "redis_after": rd1,
                "nk_load_s": nk_s,
                "redis_load_s": rd_s,
                "ratio": nk1["total"] / rd1,
                "ratio_growth": (nk1["total"] - nk0["total"]) / max(1, rd1 - rd0),
            }
            rows.append(row)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            await c.delete(table, recursive=True)
    r.flushall()
    return rows


def report(rows: list[dict]) -> str:
    out = [
        "| value | keys | table | NodeKernel: heap + DRAM used | Redis RSS | ratio | "
        "per value: nk / Redis | target ≤ 2x |",
        "|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        n = r["count"]
        nk_pv = (r["nk_after"]["total"] - r["nk_before"]["total"]) / n
        rd_pv = (r["redis_after"] - r["redis_before"]) / n
        out.append(
            f"| {r['size']} B | {n:,} | {'enumerable' if r['enumerable'] else 'non-enumerable'} "
            f"| {human(r['nk_after']['anon'])} + {human(r['nk_after']['dram'])} "
            f"= {human(r['nk_after']['total'])} | {human(r['redis_after'])} "
            f"| {r['ratio']:.2f}x | {nk_pv:.0f} B / {rd_pv:.0f} B "
            f"| {'met' if r['ratio'] <= 2 else 'missed'} |"
        )
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--meta", required=True)
    p.add_argument("--redis", required=True, help="host:port")
    p.add_argument("--nk-pid", type=int, required=True)
    p.add_argument("--redis-pid", type=int, required=True)
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1024])
    p.add_argument(
        "--enumerable",
        type=lambda s: s == "yes",
        nargs="+",
        default=[False, True],
        help="yes/no per table kind to measure",
    )
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = asyncio.run(run(args))
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

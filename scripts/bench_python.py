"""Python client benchmark (issue #11), driven by scripts/bench-python.sh.

One client, one operation at a time, from Python:

* key/value: NodeKernel `Client.put` / `Client.get` (and `get_into`, for
  context) on a Table, co-located with the cluster, against redis-py
  `set` / `get` over TCP; p50/p99 latency and ops/s for each value size;
* sequential: writing and reading one large file through fsspec, the `nk`
  filesystem against the `file` filesystem on a directory in /dev/shm, MB/s
  (10^6 bytes per second), each measured several times (the median counts);
  the native `Client.open` reader and writer are measured alongside, to tell
  the fsspec layer's cost from the client's.

Prints Markdown tables with the ratios and the product targets (met or
missed) and writes one JSON object per measurement to `--out`.
`--report FILE...` prints the tables again from such files.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any, Callable, Optional

SIZES = {"4": 4, "1KiB": 1 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
# Measured operations per size at --scale 1 (a 1 MiB Redis GET through the
# pure-Python parser takes milliseconds; a 4 B NodeKernel get tens of µs).
OPS = {"4": 20000, "1KiB": 20000, "64KiB": 10000, "1MiB": 2000}
SYSTEMS = {"nk": "NodeKernel", "redis": "redis-py"}


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20}
    t = text.strip().lower()
    for suffix, mult in units.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


class Recorder:
    """Collects the result objects, writing each to the JSON lines file."""

    def __init__(self, path: str, run: str):
        self.run = run
        self.rows: list[dict] = []
        self._f = open(path, "w", encoding="utf-8")

    def add(self, row: dict) -> dict:
        row = {"run": self.run, **row}
        self.rows.append(row)
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        return row

    def close(self) -> None:
        self._f.close()


def progress(msg: str) -> None:
    print(f"[bench-python] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Key/value latency


def time_ops(op: Callable[..., Any], args: Sequence[tuple], warmup: int) -> dict:
    """Runs `op(*a)` for the first `warmup` tuples unmeasured, then times
    each of the rest; returns latency percentiles (µs) and ops/s."""
    for a in args[:warmup]:
        op(*a)
    todo = args[warmup:]
    lat = [0] * len(todo)
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        start = clock()
        for i, a in enumerate(todo):
            t = clock()
            op(*a)
            lat[i] = clock() - t
        total = clock() - start
    finally:
        gc.enable()
    lat.sort()
    return {
        "ops": len(todo),
        "warmup": warmup,
        "p50_us": percentile(lat, 50) / 1e3,
        "p99_us": percentile(lat, 99) / 1e3,
        "mean_us": sum(lat) / len(lat) / 1e3,
        "ops_per_sec": len(todo) / (total / 1e9),
    }


def bench_kv(rec: Recorder, nk: Any, r: Any, sizes: list[str], keys: int, scale: float) -> None:
    import numpy

    root = f"/bench-python-{uuid.uuid4().hex[:8]}"
    nk.mkdir(root, type="dir")
    try:
        for label in sizes:
            size = SIZES[label]
            n = max(keys * 2, int(OPS[label] * scale))
            warmup = max(keys, n // 10)
            value = os.urandom(size)
            table = f"{root}/s{label}"
            nk.mkdir(table, type="table")
            nk_keys = [f"{table}/k{i}" for i in range(keys)]
            rd_keys = [f"bench-python:{label}:k{i}".encode() for i in range(keys)]
            seq = [i % keys for i in range(warmup + n)]
            # NumPy memory is 64-byte aligned; a bytearray's is not, and a
            # large copy into it runs markedly slower on this CPU.
            buf = numpy.empty(size, dtype=numpy.uint8)
            cases = [
                ("nk", "put", nk.put, [(nk_keys[i], value) for i in seq]),
                ("redis", "put", r.set, [(rd_keys[i], value) for i in seq]),
                ("nk", "get", nk.get, [(nk_keys[i],) for i in seq]),
                ("nk", "get_into", nk.get_into, [(nk_keys[i], buf) for i in seq]),
                ("redis", "get", r.get, [(rd_keys[i],) for i in seq]),
            ]
            for system, op, fn, args in cases:
                res = time_ops(fn, args, warmup)
                if op == "put":  # every key holds `value` from here on
                    got = nk.get(nk_keys[-1]) if system == "nk" else r.get(rd_keys[-1])
                    if got != value:
                        raise SystemExit(f"{system}: read back a wrong value of {label}")
                if op == "get_into" and buf.tobytes() != value:
                    raise SystemExit(f"nk get_into: wrong value of {label}")
                row = rec.add(
                    {"kind": "kv", "system": system, "op": op, "size": size, "size_label": label}
                    | res
                )
                progress(
                    f"{SYSTEMS[system]:10} {op:8} {label:>5}: p50 {row['p50_us']:8.1f} µs  "
                    f"p99 {row['p99_us']:8.1f} µs  {row['ops_per_sec']:8.0f} ops/s"
                )
            r.delete(*rd_keys)
            nk.delete(table, recursive=True)
    finally:
        try:
            nk.delete(root, recursive=True)
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Sequential bandwidth


def write_file(open_fn: Callable[[], Any], chunk: bytes, count: int) -> float:
    start = time.perf_counter()
    with open_fn() as f:
        for _ in range(count):
            f.write(chunk)
    return time.perf_counter() - start


def read_file(open_fn: Callable[[], Any], chunk: int, expect: int) -> float:
    got = 0
    start = time.perf_counter()
    with open_fn() as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            got += len(b)
    elapsed = time.perf_counter() - start
    if got != expect:
        raise SystemExit(f"read {got} bytes, expected {expect}")
    return elapsed


def readinto_file(open_fn: Callable[[], Any], buf: Any, expect: int) -> float:
    got = 0
    start = time.perf_counter()
    with open_fn() as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            got += n
    elapsed = time.perf_counter() - start
    if got != expect:
        raise SystemExit(f"read {got} bytes, expected {expect}")
    return elapsed


def bench_seq(
    rec: Recorder,
    nk: Any,
    meta: str,
    shm_dir: str,
    total: int,
    chunk_size: int,
    repeats: int,
    native: bool,
) -> None:
    """Each round writes every target's file (replacing the last one; the
    delete is not timed), then each round reads them all back: the rows
    take turns, so a noisy moment hits all of them alike."""
    import fsspec
    import numpy

    count = total // chunk_size
    total = count * chunk_size
    chunk = os.urandom(chunk_size)
    nkfs = fsspec.filesystem("nk", meta=meta)
    localfs = fsspec.filesystem("file")
    nk_dir = f"/bench-python-seq-{uuid.uuid4().hex[:8]}"
    nk.mkdir(nk_dir, type="dir")

    def nk_remove(path: str) -> None:
        if nk.exists(path):
            nk.delete(path)

    def shm_remove(path: str) -> None:
        if os.path.exists(path):
            os.remove(path)

    # (system, api, path, opener(path, mode), remove(path))
    targets: list[tuple[str, str, str, Callable[..., Any], Callable[[str], None]]] = [
        ("nk", "fsspec", f"{nk_dir}/fsspec", nkfs.open, nk_remove),
        ("shm", "fsspec", os.path.join(shm_dir, "fsspec"), localfs.open, shm_remove),
    ]
    if native:
        targets.append(("nk", "native", f"{nk_dir}/native", nk.open, nk_remove))
    buf = numpy.empty(chunk_size, dtype=numpy.uint8)  # aligned, see bench_kv
    times: dict[tuple[str, str, str], list[float]] = {}

    def note(key: tuple[str, str, str], rep: int, t: float) -> None:
        times.setdefault(key, []).append(t)
        progress(f"{'/'.join(key):22} {rep + 1}: {total / t / 1e6:8.0f} MB/s")

    try:
        for rep in range(repeats):
            for system, api, path, opener, remove in targets:
                remove(path)
                t = write_file(lambda o=opener, p=path: o(p, "wb"), chunk, count)
                note((system, api, "write"), rep, t)
        for rep in range(repeats):
            for system, api, path, opener, _ in targets:
                t = read_file(lambda o=opener, p=path: o(p, "rb"), chunk_size, total)
                note((system, api, "read"), rep, t)
                if api == "native" or system == "shm":
                    t = readinto_file(lambda o=opener, p=path: o(p, "rb"), buf, total)
                    note((system, api, "readinto"), rep, t)
        for (system, api, op), ts in times.items():
            mbs = [total / t / 1e6 for t in ts]
            rec.add(
                {
                    "kind": "seq",
                    "system": system,
                    "api": api,
                    "op": op,
                    "bytes": total,
                    "chunk": chunk_size,
                    "mb_per_sec": mbs,
                    "median_mb_per_sec": statistics.median(mbs),
                }
            )
    finally:
        for system, _, path, _, remove in targets:
            if system == "shm":
                remove(path)
        try:
            nk.delete(nk_dir, recursive=True)
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Report


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def fmt_us(x: float) -> str:
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def report(runs: list[list[dict]]) -> str:
    """Markdown tables of one run, or of several side by side (each cell
    `run 1 / run 2 / ...`)."""
    out: list[str] = []

    def cells(values: list[str]) -> str:
        return " / ".join(values)

    for rows in runs:
        env = next((r for r in rows if r.get("kind") == "env"), {})
        if env:
            out.append(
                f"- Run `{env.get('run')}`: Python {env.get('python')}, redis-py "
                f"{env.get('redis_py')} ({env.get('redis_parser')} parser), Redis server "
                f"{env.get('redis_server')}, fsspec {env.get('fsspec')}; NodeKernel "
                f"{env.get('nk_data_path')}."
            )
    out.append("")
    kv = [
        {(r["system"], r["op"], r["size_label"]): r for r in rows if r.get("kind") == "kv"}
        for rows in runs
    ]
    if any(kv):
        out.append(
            "| op | size | NodeKernel p50 µs | p99 µs | ops/s | redis-py p50 µs | p99 µs "
            "| ops/s | p50 ratio | ops/s ratio | target | |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for op, peer_op in (("get", "get"), ("get_into", "get"), ("put", "put")):
            for label in SIZES:
                pairs = [(k.get(("nk", op, label)), k.get(("redis", peer_op, label))) for k in kv]
                pairs = [(a, b) for a, b in pairs if a and b]
                if not pairs:
                    continue
                ratios = [a["p50_us"] / b["p50_us"] for a, b in pairs]
                target, status = "", ""
                if op == "get":
                    limit = 1.0 if SIZES[label] <= 1 << 10 else 0.5
                    target = f"<= {limit:g}x"
                    status = cells([mark(x <= limit) for x in ratios])
                name = {"get": "get / GET", "get_into": "get_into / GET", "put": "put / SET"}[op]
                row = [name, label]
                for side in (0, 1):
                    row += [
                        cells([fmt_us(p[side]["p50_us"]) for p in pairs]),
                        cells([fmt_us(p[side]["p99_us"]) for p in pairs]),
                        cells([f"{p[side]['ops_per_sec']:.0f}" for p in pairs]),
                    ]
                row += [
                    cells([f"{x:.2f}x" for x in ratios]),
                    cells([f"{a['ops_per_sec'] / b['ops_per_sec']:.2f}x" for a, b in pairs]),
                    target,
                    status,
                ]
                out.append("| " + " | ".join(row) + " |")
        out.append("")
    seq = [
        {(r["system"], r["api"], r["op"]): r for r in rows if r.get("kind") == "seq"}
        for rows in runs
    ]
    if any(seq):
        first = next(iter(next(s for s in seq if s).values()))
        out.append(
            f"Sequential, one {human(first['bytes'])} file in {human(first['chunk'])} "
            f"chunks; MB/s, the median of {len(first['mb_per_sec'])} passes (then the "
            "slowest and fastest pass):\n"
        )
        out.append("| op | NodeKernel | MB/s | /dev/shm | MB/s | share | target | |")
        out.append("|---|---|---:|---|---:|---:|---|---|")

        def mbs(rs: list[dict]) -> str:
            every = [x for r in rs for x in r["mb_per_sec"]]
            med = cells([f"{r['median_mb_per_sec']:.0f}" for r in rs])
            return f"{med} ({min(every):.0f}-{max(every):.0f})"

        for op in ("write", "read", "readinto"):
            for api in ("fsspec", "native"):
                pairs = [(s.get(("nk", api, op)), s.get(("shm", "fsspec", op))) for s in seq]
                pairs = [(a, b) for a, b in pairs if a and b]
                if not pairs:
                    continue
                shares = [a["median_mb_per_sec"] / b["median_mb_per_sec"] for a, b in pairs]
                target, status = "", ""
                if op == "read" and api == "fsspec":
                    target, status = ">= 70%", cells([mark(x >= 0.7) for x in shares])
                name = "readinto (NumPy buffer)" if op == "readinto" else op
                nk_api = {"fsspec": "fsspec `nk`", "native": "`Client.open`"}[api]
                out.append(
                    f"| {name} | {nk_api} | {mbs([a for a, _ in pairs])} | fsspec `file` | "
                    f"{mbs([b for _, b in pairs])} | {cells([f'{x:.0%}' for x in shares])} | "
                    f"{target} | {status} |"
                )
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------


def describe_env(rec: Recorder, nk: Any, r: Any) -> None:
    import fsspec
    import redis

    parser = "hiredis" if getattr(redis.utils, "HIREDIS_AVAILABLE", False) else "pure-Python"
    status = nk.status()
    rec.add(
        {
            "kind": "env",
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "redis_py": redis.__version__,
            "redis_parser": parser,
            "redis_server": r.info("server").get("redis_version"),
            "fsspec": fsspec.__version__,
            "nodekernel_module": __import__("nodekernel").__file__,
            "nk_servers": [
                {k: s.get(k) for k in ("medium", "location", "capacity_bytes")}
                for s in status.get("servers", [])
            ],
            # The Python client does not report the path it took; a client on
            # the servers' host maps their DRAM (see docs/shared-memory.md).
            "nk_data_path": "co-located (shared memory, same host)",
        }
    )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--meta", help="NodeKernel metadata server host:port")
    p.add_argument("--redis", help="Redis host:port")
    p.add_argument("--out", help="JSON lines output file")
    p.add_argument("--run", default=time.strftime("%Y-%m-%dT%H:%M:%S"), help="label of this run")
    p.add_argument("--shm-dir", help="directory on /dev/shm for the fsspec `file` baseline")
    p.add_argument("--sizes", default=",".join(SIZES), help="value sizes (default: all)")
    p.add_argument("--keys", type=int, default=100, help="keys cycled per size (default 100)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the operation counts")
    p.add_argument("--file-size", type=parse_size, default=1 << 30, help="default 1GiB")
    p.add_argument("--chunk", type=parse_size, default=16 << 20, help="default 16MiB")
    p.add_argument("--repeats", type=int, default=3, help="sequential runs per row (median)")
    p.add_argument("--skip-kv", action="store_true")
    p.add_argument("--skip-seq", action="store_true")
    p.add_argument("--no-native", action="store_true", help="skip the Client.open rows")
    p.add_argument(
        "--report",
        nargs="+",
        metavar="FILE",
        help="only print the tables of earlier runs' --out files (several: side by side)",
    )
    a = p.parse_args(argv)

    if a.report:
        runs = []
        for path in a.report:
            with open(path, encoding="utf-8") as f:
                runs.append([json.loads(line) for line in f if line.strip()])
        print(report(runs))
        return 0
    if not (a.meta and a.redis and a.out):
        p.error("--meta, --redis and --out are needed (or --report)")
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    for s in sizes:
        if s not in SIZES:
            p.error(f"unknown size {s!r}; one of {', '.join(SIZES)}")

    import redis

    import nodekernel

    host, _, port = a.redis.rpartition(":")
    r = redis.Redis(host=host or "127.0.0.1", port=int(port))
    r.ping()
    nk = nodekernel.connect(a.meta)
    rec = Recorder(a.out, a.run)
    shm_dir = a.shm_dir
    own_shm = shm_dir is None and not a.skip_seq
    if own_shm:
        shm_dir = tempfile.mkdtemp(prefix="bench-python.", dir="/dev/shm")
    try:
        describe_env(rec, nk, r)
        if not a.skip_kv:
            progress(f"key/value: sizes {', '.join(sizes)}, {a.keys} keys, scale {a.scale:g}")
            bench_kv(rec, nk, r, sizes, a.keys, a.scale)
        if not a.skip_seq:
            progress(f"sequential: {human(a.file_size)} in {human(a.chunk)} chunks, x{a.repeats}")
            bench_seq(rec, nk, a.meta, shm_dir, a.file_size, a.chunk, a.repeats, not a.no_native)
    finally:
        rec.close()
        nk.close()
        if own_shm and shm_dir:
            shutil.rmtree(shm_dir, ignore_errors=True)
    print(report([rec.rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The scale curves of issue #12 (scripts/bench-scale.sh).

Subcommands:
  header ...          the first JSON line of a run (what was measured with)
  line ...            one `nk bench --json` run as a JSON line
  mib SIZE            SIZE (e.g. 4GiB) in MiB, for the shell
  tables FILE [--png PNG]
                      the Markdown tables of docs/benchmarks.md, every target
                      row marked met or missed, and the plot (matplotlib)

`header`, `line` and `mib` need only the standard library.
"""

import argparse
import datetime
import json
import os
import platform
import sys

SIZES = ["4", "1KiB", "1MiB"]
OPS = ["getkey", "putkey"]
PATHS = ["colocated", "remote"]
PEERS = ["redis", "memcached"]
UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size_bytes(text):
    """'4', '1KiB', '4GiB' -> bytes."""
    digits = text.rstrip("BKMGTi")
    unit = text[len(digits) :]
    if unit not in UNITS or not digits.isdigit():
        raise ValueError(f"bad size {text!r}")
    return int(digits) * UNITS[unit]


def size_label(size):
    return "4 B" if size == "4" else size.replace("KiB", " KiB").replace("MiB", " MiB")


def cmd_header(a):
    print(
        json.dumps(
            {
                "header": {
                    "date": datetime.date.today().isoformat(),
                    "commit": a.commit,
                    "cpus": os.cpu_count(),
                    "kernel": platform.release(),
                    "redis": a.redis,
                    "memcached": a.memcached,
                    "quick": a.quick not in ("", "0"),
                    "server_spin_us": a.server_spin,
                    "dram": a.dram,
                }
            }
        )
    )


def cmd_line(a):
    row = {
        "stores": a.stores,
        "path": a.path,
        "op": a.op,
        "size": a.size,
        "clients": a.clients,
        "wall_s": round(float(a.wall[1]) - float(a.wall[0]), 3),
    }
    report = None
    if a.rc == 0:
        try:
            with open(a.report) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            row["error"] = f"unreadable report: {e}"
    if report is not None:
        row["report"] = report
    elif "error" not in row:
        with open(a.stderr, errors="replace") as f:
            tail = f.read()[-600:].strip()
        what = "timed out" if a.rc == 124 else f"exit status {a.rc}"
        row["error"] = f"{what}: {tail}"
    print(json.dumps(row))


class Results:
    """The JSON lines of one run, indexed."""

    def __init__(self, path):
        self.header = {}
        self.rows = {}
        self.peers = {}
        self.wall = 0.0
        with open(path) as f:
            for text in f:
                if not text.strip():
                    continue
                r = json.loads(text)
                if "header" in r:
                    self.header = r["header"]
                    continue
                self.wall += r.get("wall_s", 0.0)
                key = (r["stores"], r["path"], r["op"], r["size"], r["clients"])
                self.rows[key] = r
                for p in r.get("report", {}).get("peers", []):
                    self.peers[(r["op"], r["size"], r["clients"], p["name"])] = p
        self.stores = sorted({k[0] for k in self.rows})
        self.clients = sorted({k[4] for k in self.rows})

    def get(self, stores, path, op, size, clients):
        """The report of a row, None if it failed, KeyError if not run."""
        return self.rows[(stores, path, op, size, clients)].get("report")

    def has(self, path, op, size, clients):
        return any((s, path, op, size, clients) in self.rows for s in self.stores)

    def per_store(self, path, op, size, clients, fn, fmt):
        """'a / b / c' over the store counts: fn(report), 'failed' or '-'."""
        cells = []
        for s in self.stores:
            key = (s, path, op, size, clients)
            if key not in self.rows:
                cells.append("-")
            elif self.rows[key].get("report") is None:
                cells.append("failed")
            else:
                cells.append(fmt.format(fn(self.rows[key]["report"])))
        return " / ".join(cells)

    def peer(self, op, size, clients, name):
        return self.peers.get((op, size, clients, name))


def ops_s(r):
    return r["ops_per_sec"]


def gb_s(r):
    return r["gb_per_sec"]


def p50(r):
    return r["latency_us"]["p50"]


def p99(r):
    return r["latency_us"]["p99"]


def mark(ok):
    return "met" if ok else "**missed**"


def peer_cells(p, *fields):
    if p is None:
        return ["-"] * len(fields)
    out = []
    for field in fields:
        v = p[field]
        out.append(f"{v:.0f}" if field == "ops_per_sec" else f"{v:.1f}")
    return out


def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header, align):
    """A table's head: `header` is the column names joined by '|', `align`
    a letter a column, 'l' or 'r'."""
    assert header.count("|") + 1 == len(align), (header, align)
    print(row(name.strip() for name in header.split("|")))
    print("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")


def print_tables(res):
    h = res.header
    stores = " / ".join(str(s) for s in res.stores)
    quick = "; QUICK (smoke run: too few operations to compare)" if h.get("quick") else ""
    print(
        f"Run: {h.get('date', '?')}, commit {h.get('commit', '?')}, {h.get('cpus', '?')} CPUs, "
        f"Linux {h.get('kernel', '?')}; {h.get('redis', 'redis ?')}; "
        f"{h.get('memcached', 'memcached ?')}; DRAM {h.get('dram', '?')} per cluster; "
        f"servers' busy-poll budget: {h.get('server_spin_us', 'default')}{quick}. "
        f"Sum of the rows' wall time: {res.wall / 60:.1f} min.\n"
    )
    latency = ((ops_s, "{:.0f}"), (p50, "{:.1f}"), (p99, "{:.1f}"))
    peer_latency = ("ops_per_sec", "p50_us", "p99_us")

    print(f"#### Key/value operations (NodeKernel cells by storage servers: {stores})\n")
    table(
        "op | size | path | clients | NodeKernel ops/s | p50 µs | p99 µs"
        " | Redis ops/s | p50 µs | p99 µs | memcached ops/s | p50 µs | p99 µs",
        "lrlr" + "r" * 9,
    )
    for op in OPS:
        for size in SIZES:
            for path in PATHS:
                for c in res.clients:
                    if not res.has(path, op, size, c):
                        continue
                    ours = [res.per_store(path, op, size, c, f, fmt) for f, fmt in latency]
                    redis = peer_cells(res.peer(op, size, c, "redis"), *peer_latency)
                    mc = peer_cells(res.peer(op, size, c, "memcached"), *peer_latency)
                    print(row([op, size_label(size), path, c, *ours, *redis, *mc]))

    print(
        "\n#### Target: throughput >= Redis's at 16 and 64 clients, <= 1 KiB "
        f"(storage servers: {stores})\n"
    )
    table(
        "op | size | path | clients | NodeKernel ops/s | Redis ops/s | ratio"
        " | NodeKernel p99 µs | Redis p99 µs | vs memcached ops/s | target | ",
        "lrlr" + "r" * 6 + "ll",
    )
    for op in OPS:
        for size in ("4", "1KiB"):
            for path in PATHS:
                for c in (16, 64):
                    if not res.has(path, op, size, c):
                        continue
                    redis = res.peer(op, size, c, "redis")
                    mc = res.peer(op, size, c, "memcached")
                    cells = [
                        res.per_store(path, op, size, c, ops_s, "{:.0f}"),
                        *peer_cells(redis, "ops_per_sec"),
                        ratio_cells(res, path, op, size, c, redis, ops_s, "ops_per_sec"),
                        res.per_store(path, op, size, c, p99, "{:.1f}"),
                        *peer_cells(redis, "p99_us"),
                        ratio_cells(res, path, op, size, c, mc, ops_s, "ops_per_sec"),
                        ">= 1x",
                        status(res, path, op, size, c, redis, faster_or_equal),
                    ]
                    print(row([op, size_label(size), path, c, *cells]))

    print(f"\n#### Target: remote p50 against Redis, 1 MiB values (storage servers: {stores})\n")
    table(
        "op | size | path | clients | NodeKernel p50 µs | Redis p50 µs | ratio | target | ",
        "lrlr" + "rrr" + "ll",
    )
    for op, target, ok in (("getkey", "<= 0.5x", half_p50), ("putkey", "< 1x", lower_p50)):
        for c in res.clients:
            if not res.has("remote", op, "1MiB", c):
                continue
            redis = res.peer(op, "1MiB", c, "redis")
            cells = [
                res.per_store("remote", op, "1MiB", c, p50, "{:.1f}"),
                *peer_cells(redis, "p50_us"),
                ratio_cells(res, "remote", op, "1MiB", c, redis, p50, "p50_us"),
                target,
                status(res, "remote", op, "1MiB", c, redis, ok),
            ]
            print(row([op, "1 MiB", "remote", c, *cells]))

    print(
        "\n#### Sequential reads, 1 MiB per read, 4 in flight per client "
        f"(storage servers: {stores})\n"
    )
    table("path | clients | GB/s | p50 µs | p99 µs", "lrrrr")
    bandwidth = ((gb_s, "{:.2f}"), (p50, "{:.1f}"), (p99, "{:.1f}"))
    for path in PATHS:
        for c in res.clients:
            if res.has(path, "read", "1MiB", c):
                cells = [res.per_store(path, "read", "1MiB", c, f, fmt) for f, fmt in bandwidth]
                print(row([path, c, *cells]))

    failed = [r for r in res.rows.values() if "error" in r]
    if failed:
        print(f"\nFailed rows ({len(failed)}):\n")
        for r in failed:
            what = f"{r['op']} {size_label(r['size'])} {r['path']}"
            where = f"{r['clients']} clients, {r['stores']} stores"
            print(f"- {what}, {where}: {r['error'][-300:]!r}")


def faster_or_equal(r, peer):
    return r["ops_per_sec"] >= peer["ops_per_sec"]


def half_p50(r, peer):
    return r["latency_us"]["p50"] <= 0.5 * peer["p50_us"]


def lower_p50(r, peer):
    return r["latency_us"]["p50"] < peer["p50_us"]


def ratio_cells(res, path, op, size, c, peer, ours, theirs):
    """NodeKernel's ours(report) over the peer's field, per store count."""
    if peer is None:
        return "-"
    return res.per_store(path, op, size, c, lambda r: ours(r) / peer[theirs], "{:.2f}x")


def status(res, path, op, size, c, peer, ok):
    """'met / **missed** / ...' over the store counts."""
    if peer is None:
        return "no Redis row"
    return res.per_store(path, op, size, c, lambda r: mark(ok(r, peer)), "{}")


def plot(res, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shades = {"colocated": plt.cm.Blues, "remote": plt.cm.Oranges}
    styles = {1: "-", 2: "--", 4: ":"}
    panels = [(op, size) for op in OPS for size in SIZES]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8.5))
    slots = [axes[0][0], axes[0][1], axes[0][2], axes[1][0], axes[1][1], axes[1][2]]
    handles = {}
    for ax, (op, size) in zip(slots, panels):
        for path in PATHS:
            for i, s in enumerate(res.stores):
                xs, ys = curve(res, s, path, op, size, ops_s)
                if xs:
                    color = shades[path](0.5 + 0.25 * i / max(1, len(res.stores) - 1))
                    label = f"NodeKernel {path}, {s} store{'s' if s > 1 else ''}"
                    (h,) = ax.plot(xs, ys, styles.get(s, "-"), marker="o", color=color, label=label)
                    handles[label] = h
        for name, color, marker in (("redis", "black", "s"), ("memcached", "green", "^")):
            pts = [(c, res.peer(op, size, c, name)) for c in res.clients]
            pts = [(c, p["ops_per_sec"]) for c, p in pts if p]
            if pts:
                label = "Redis" if name == "redis" else "memcached"
                (h,) = ax.plot(*zip(*pts), "-.", marker=marker, color=color, label=label)
                handles[label] = h
        ax.set_title(f"{op} {size_label(size)}")
        ax.set_ylabel("ops/s")
    ax = axes[0][3]
    for path in PATHS:
        for i, s in enumerate(res.stores):
            xs, ys = curve(res, s, path, "read", "1MiB", gb_s)
            if xs:
                color = shades[path](0.5 + 0.25 * i / max(1, len(res.stores) - 1))
                ax.plot(xs, ys, styles.get(s, "-"), marker="o", color=color)
    ax.set_title("sequential read, 1 MiB reads, 4 in flight")
    ax.set_ylabel("GB/s")
    for ax in [*slots, axes[0][3]]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(res.clients, [str(c) for c in res.clients])
        ax.set_xlabel("clients")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[1][3].axis("off")
    axes[1][3].legend(handles.values(), handles.keys(), loc="center", fontsize=10)
    h = res.header
    fig.suptitle(
        f"NodeKernel scale curves: throughput against clients ({h.get('date', '?')}, commit {h.get('commit', '?')}, "
        f"{h.get('cpus', '?')} CPUs{'; QUICK smoke run' if h.get('quick') else ''})"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    print(f"\nPlot: {png}", file=sys.stderr)


def curve(res, stores, path, op, size, fn):
    xs, ys = [], []
    for c in res.clients:
        r = res.rows.get((stores, path, op, size, c), {}).get("report")
        if r is not None:
            xs.append(c)
            ys.append(fn(r))
    return xs, ys


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("header")
    p.add_argument("--commit", required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--memcached", required=True)
    p.add_argument("--quick", default="0")
    p.add_argument("--server-spin", default="default")
    p.add_argument("--dram", default="?")
    p = sub.add_parser("line")
    p.add_argument("--stores", type=int, required=True)
    p.add_argument("--path", choices=PATHS, required=True)
    p.add_argument("--op", choices=[*OPS, "read"], required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--wall", nargs=2, required=True, metavar=("START", "END"))
    p.add_argument("--report", required=True)
    p.add_argument("--stderr", required=True)
    p = sub.add_parser("mib")
    p.add_argument("size")
    p = sub.add_parser("tables")
    p.add_argument("results")
    p.add_argument("--png", help="write the plot here (needs matplotlib)")
    a = ap.parse_args()
    if a.cmd == "header":
        cmd_header(a)
    elif a.cmd == "line":
        cmd_line(a)
    elif a.cmd == "mib":
        print(size_bytes(a.size) >> 20)
    else:
        res = Results(a.results)
        print_tables(res)
        if a.png:
            plot(res, a.png)


if __name__ == "__main__":
    main()

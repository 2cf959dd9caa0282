"""The cluster Spark benchmark of scripts/bench-spark-cluster.sh (issue 39,
acceptance 4): every setting, what it runs and the tables it prints are in
that script's header. Run by it, with java/nodekernel-spark/pyspark on
PYTHONPATH and the pyspark wheel's Python."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import netns
from spark_cluster import DEFAULT_MANAGER, MANAGER, WORKERS, SparkCluster, read_event_log

APP_CLASS = "SparkClusterBench"
ALL_JOBS = ("sort", "group", "join", "broadcast")
NAME = {"default": "default (sort) + external shuffle service", "nodekernel": "NodeKernel"}
WHAT = {
    "sort": "sortByKey (TeraSort style)",
    "group": "groupByKey",
    "join": "SQL join + aggregation",
    "broadcast": "broadcast read",
}


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def say(msg: str) -> None:
    print(f"[bench-spark-cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Settings:
    def __init__(self) -> None:
        self.runs = int(env("RUNS", "1"))
        self.placement_runs = int(env("PLACEMENT_RUNS", str(self.runs)))
        self.jobs = env("JOBS", " ".join(ALL_JOBS)).split()
        self.placement_jobs = env("PLACEMENT_JOBS", "sort group").split()
        self.placements = env("PLACEMENTS", "colocated disaggregated file").split()
        self.sort_gib = env("SORT_GIB", "1")
        self.group_gib = env("GROUP_GIB", "1")
        self.keys = env("GROUP_KEYS", "100000")
        self.partitions = env("PARTITIONS", "24")
        self.join_rows = env("JOIN_ROWS", "6000000")
        self.join_keys = env("JOIN_KEYS", "500000")
        self.broadcast_mib = env("BROADCAST_MIB", "100")
        self.executor_mem = env("EXECUTOR_MEM", "1g")
        self.driver_mem = env("DRIVER_MEM", "1g")
        self.store_size = env("STORE_SIZE", "1GiB")
        self.file_size = env("FILE_STORE_SIZE", "4GiB")
        for j in (*self.jobs, *self.placement_jobs):
            if j not in ALL_JOBS:
                raise SystemExit(f"bench-spark-cluster: no job {j} (jobs: {' '.join(ALL_JOBS)})")
        for p in self.placements:
            if p not in ("colocated", "disaggregated", "file"):
                raise SystemExit(f"bench-spark-cluster: no placement {p}")
        if "colocated" not in self.placements:
            raise SystemExit("bench-spark-cluster: PLACEMENTS must include colocated")

    def app_args(self, manager: str, jobs: list[str], seed: int) -> list[str]:
        return [
            "--manager",
            manager,
            "--jobs",
            ",".join(jobs),
            "--sort-gib",
            self.sort_gib,
            "--group-gib",
            self.group_gib,
            "--keys",
            self.keys,
            "--partitions",
            self.partitions,
            "--join-rows",
            self.join_rows,
            "--join-keys",
            self.join_keys,
            "--broadcast-mib",
            self.broadcast_mib,
            "--seed",
            str(seed),
        ]


# ---- the event log ----


def breakdown(event_log: str) -> dict[str, dict]:
    """Per job group: the stage times (summed by kind: a map stage writes a
    shuffle and reads none, a reduce stage reads one and writes none, a
    middle stage does both, other stages neither), the task metrics summed,
    and every stage's attempts (a rerun shows as attempt > 0)."""
    events, group_of_stage = read_event_log(event_log)
    stage_ms: dict[tuple[int, int], int] = {}
    per_stage: dict[int, dict] = {}
    for ev in events:
        kind = ev["Event"]
        if kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            if "Submission Time" in info and "Completion Time" in info:
                key = (info["Stage ID"], info["Stage Attempt ID"])
                stage_ms[key] = info["Completion Time"] - info["Submission Time"]
        elif kind == "SparkListenerTaskEnd":
            m = ev.get("Task Metrics") or {}
            r = m.get("Shuffle Read Metrics", {})
            w = m.get("Shuffle Write Metrics", {})
            s = per_stage.setdefault(
                ev["Stage ID"],
                {
                    "tasks": 0,
                    "failed": 0,
                    "attempts": set(),
                    "written": 0,
                    "write_ns": 0,
                    "remote_read": 0,
                    "local_read": 0,
                    "fetch_wait_ms": 0,
                    "run_ms": 0,
                    "cpu_ns": 0,
                    "gc_ms": 0,
                    "hosts": set(),
                },
            )
            s["tasks"] += 1
            s["failed"] += ev["Task End Reason"]["Reason"] != "Success"
            s["attempts"].add(ev["Stage Attempt ID"])
            s["written"] += w.get("Shuffle Bytes Written", 0)
            s["write_ns"] += w.get("Shuffle Write Time", 0)
            s["remote_read"] += r.get("Remote Bytes Read", 0)
            s["local_read"] += r.get("Local Bytes Read", 0)
            s["fetch_wait_ms"] += r.get("Fetch Wait Time", 0)
            s["run_ms"] += m.get("Executor Run Time", 0)
            s["cpu_ns"] += m.get("Executor CPU Time", 0)
            s["gc_ms"] += m.get("JVM GC Time", 0)
            s["hosts"].add(ev["Task Info"]["Host"])
    out: dict[str, dict] = {}
    for sid, s in per_stage.items():
        g = out.setdefault(
            group_of_stage.get(sid),
            {
                "map_ms": 0,
                "middle_ms": 0,
                "reduce_ms": 0,
                "other_ms": 0,
                "tasks": 0,
                "failed": 0,
                "reruns": 0,
                "written": 0,
                "write_ms": 0.0,
                "remote_read": 0,
                "local_read": 0,
                "fetch_wait_ms": 0,
                "run_ms": 0,
                "cpu_ms": 0.0,
                "gc_ms": 0,
                "hosts": set(),
            },
        )
        ms = sum(v for (i, _), v in stage_ms.items() if i == sid)
        read = s["remote_read"] + s["local_read"]
        kind = (
            "middle"
            if read and s["written"]
            else "map"
            if s["written"]
            else "reduce"
            if read
            else "other"
        )
        g[f"{kind}_ms"] += ms
        g["reruns"] += len(s["attempts"]) - 1
        for k in ("tasks", "failed", "written", "remote_read", "local_read"):
            g[k] += s[k]
        for k in ("fetch_wait_ms", "run_ms", "gc_ms"):
            g[k] += s[k]
        g["write_ms"] += s["write_ns"] / 1e6
        g["cpu_ms"] += s["cpu_ns"] / 1e6
        g["hosts"] |= s["hosts"]
    return out


# ---- one cluster ----


def run_placement(
    st: Settings, placement: str, nk_bin: str, jars: list[str], app: str, save
) -> list:
    """Starts the cluster of `placement`, runs its applications RUNS times
    (PLACEMENT_RUNS but for the co-located layout), returns one record per
    (application, job) and hands each application's to `save`."""
    colocated = placement != "disaggregated"
    # Disaggregated: the storage servers on hosts 4..6, which run no
    # executor (host 3 stays the driver's).
    store_hosts = tuple(range(WORKERS)) if colocated else tuple(range(4, 4 + WORKERS))
    net = netns.Net.create(4 if colocated else 4 + WORKERS)
    if net is None:
        raise SystemExit("bench-spark-cluster: needs root and ip netns")
    medium, size = ("file", st.file_size) if placement == "file" else ("dram", st.store_size)
    c = SparkCluster(
        net,
        nk_bin,
        jars,
        store_hosts=store_hosts,
        store_medium=medium,
        store_size=size,
        executor_memory=st.executor_mem,
        driver_memory=st.driver_mem,
        worker_memory=st.executor_mem,
        # Spark's external shuffle service in every worker, as clusters run
        # the default shuffle (NodeKernel's applications do not use it).
        worker_opts="-Dspark.shuffle.service.enabled=true",
    )
    records = []
    failed = True
    try:
        say(f"== {placement}: storage servers ({medium}, {size}) on hosts {list(store_hosts)} ==")
        c.start()
        managers = ["default", "nodekernel"] if placement == "colocated" else ["nodekernel"]
        jobs = st.jobs if placement == "colocated" else st.placement_jobs
        conf = {
            "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
            "spark.sql.adaptive.enabled": "true",
            # Not the working directory's spark-warehouse.
            "spark.sql.warehouse.dir": c.path("warehouse"),
        }
        i = 0
        runs = st.runs if placement == "colocated" else st.placement_runs
        for run in range(1, runs + 1):
            # Alternate which shuffle goes first.
            order = managers if i % 2 == 0 else managers[::-1]
            i += 1
            for m in order:
                name = f"{placement}-{m}-r{run}"
                extra = dict(conf)
                if m == "default":
                    extra["spark.shuffle.service.enabled"] = "true"
                say(f"run {run}: {placement}, {NAME[m]}: {' '.join(jobs)}")
                subprocess.run(["sync"], check=False)
                t0 = time.monotonic()
                res = c.submit(
                    m == "nodekernel",
                    name,
                    *st.app_args(m, jobs, seed=1),
                    conf=extra,
                    java=(APP_CLASS, app),
                ).result()
                want = MANAGER if m == "nodekernel" else DEFAULT_MANAGER
                assert res["manager"] == want, (res["manager"], want)
                groups = breakdown(res["event_log"])
                for job in jobs:
                    g = groups.get(job)
                    if g is None:
                        raise SystemExit(f"bench-spark-cluster: no stages of {job} in {name}")
                    if g["failed"] or g["reruns"]:
                        raise SystemExit(
                            f"bench-spark-cluster: {name} {job}: {g['failed']} failed tasks, "
                            f"{g['reruns']} stage reruns (logs: {c.dir})"
                        )
                    g["hosts"] = sorted(g["hosts"])
                    rec = {
                        "placement": placement,
                        "manager": m,
                        "run": run,
                        "job": job,
                        "app": res["app"],
                        **res[job],
                        **g,
                    }
                    records.append(rec)
                    save(rec)
                    say(f"  {job}: {rec['job_ms'] / 1000:.1f} s" + broadcast_note(rec))
                say(f"  application done in {time.monotonic() - t0:.0f} s ({res['app']})")
        failed = False
    finally:
        keep = failed or bool(os.environ.get("KEEP_LOGS"))
        c.close(keep=keep)
    return records


def broadcast_note(rec: dict) -> str:
    if rec["job"] != "broadcast":
        return ""
    return f" (reads {rec['read_ms']} ms on executors {rec['executors']})"


# ---- tables ----


def med(rs: list[dict], key) -> float:
    return statistics.median(key(r) if callable(key) else r[key] for r in rs)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def size_of(st: Settings, job: str, r: dict) -> str:
    if job in ("sort", "group"):
        return f"{r['gib']:g} GiB, {r['records'] / 1e6:.1f}M records"
    if job == "join":
        return f"{r['rows'] / 1e6:g}M x {r.get('keys', int(st.join_keys)) / 1e6:g}M rows"
    return f"{r['mib']} MiB"


def tables(st: Settings, records: list[dict]) -> None:
    by: dict[tuple, list[dict]] = {}
    for r in records:
        by.setdefault((r["placement"], r["job"], r["manager"]), []).append(r)

    # Equal results across every run: the join's hash sums (counts and sums
    # are checked in the application).
    digests = {r["digest"] for r in records if r["job"] == "join"}
    if len(digests) > 1:
        raise SystemExit(f"bench-spark-cluster: the join's results differ between runs: {digests}")

    def read_max(r):
        return max(r["read_ms"])

    def read_mean(r):
        return sum(r["read_ms"]) / len(r["read_ms"])

    target = {"sort": 0.8, "group": 0.8, "broadcast": 0.5}
    print(
        "### Across hosts: NodeKernel's shuffle against the default with its external shuffle service"
    )
    print()
    print(
        "| job | size | shuffle | job time s | runs s | map stage s | reduce stage s "
        "| NodeKernel / default | target |"
    )
    print("|---|---|---|---:|---|---:|---:|---:|---|")

    def both(job: str) -> bool:
        return all(("colocated", job, m) in by for m in ("default", "nodekernel"))

    for job in st.jobs:
        if job == "broadcast" or not both(job):
            continue
        base = med(by[("colocated", job, "default")], "job_ms")
        for m in ("default", "nodekernel"):
            rs = by[("colocated", job, m)]
            t = med(rs, "job_ms")
            ratio = tgt = ""
            if m == "nodekernel":
                ratio = f"{t / base:.2f}x"
                if job in target:
                    ok = t <= target[job] * base
                    tgt = f"<= {target[job]}x: " + ("met" if ok else "**missed**")
                else:
                    tgt = "(none)"
            runs = " / ".join(f"{r['job_ms'] / 1000:.1f}" for r in rs)
            mid = med(rs, "middle_ms")
            reduce_s = med(rs, "reduce_ms") / 1000
            reduce_cell = f"{reduce_s:.1f}" + (f" (+{mid / 1000:.1f} middle)" if mid else "")
            print(
                f"| {WHAT[job]} | {size_of(st, job, rs[0])} | {NAME[m]} | {t / 1000:.1f} | {runs} "
                f"| {med(rs, 'map_ms') / 1000:.1f} | {reduce_cell} | {ratio} | {tgt} |"
            )
    print()
    if "broadcast" in st.jobs and both("broadcast"):
        print(
            "| broadcast | shuffle manager | read s, slowest executor | read s, mean | runs s "
            "(slowest) | create s (driver) | job s | NkBroadcast / Torrent | target |"
        )
        print("|---|---|---:|---:|---|---:|---:|---:|---|")
        base = med(by[("colocated", "broadcast", "default")], read_max)
        for m, what in (("default", "TorrentBroadcast"), ("nodekernel", "NkBroadcast")):
            rs = by[("colocated", "broadcast", m)]
            t = med(rs, read_max)
            ratio = tgt = ""
            if m == "nodekernel":
                ratio = f"{t / base:.2f}x"
                tgt = "<= 0.5x: " + ("met" if t <= 0.5 * base else "**missed**")
            runs = " / ".join(f"{read_max(r) / 1000:.2f}" for r in rs)
            print(
                f"| {what}, {rs[0]['mib']} MiB | {NAME[m]} | {t / 1000:.2f} "
                f"| {med(rs, read_mean) / 1000:.2f} | {runs} | {med(rs, 'create_ms') / 1000:.2f} "
                f"| {med(rs, 'job_ms') / 1000:.2f} | {ratio} | {tgt} |"
            )
        print()

    print("Stage-time breakdown (event log; medians; task times summed over tasks):")
    print()
    print(
        "| placement | job | shuffle | shuffle written GiB | remote read GiB | local read GiB "
        "| write time s | fetch wait s | task run s | task CPU s | GC s | tasks | hosts |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for (placement, job, m), rs in by.items():
        if job == "broadcast":
            continue
        print(
            f"| {placement} | {WHAT[job]} | {NAME[m]} | {gib(med(rs, 'written'))} "
            f"| {gib(med(rs, 'remote_read'))} | {gib(med(rs, 'local_read'))} "
            f"| {med(rs, 'write_ms') / 1000:.1f} | {med(rs, 'fetch_wait_ms') / 1000:.1f} "
            f"| {med(rs, 'run_ms') / 1000:.1f} | {med(rs, 'cpu_ms') / 1000:.1f} "
            f"| {med(rs, 'gc_ms') / 1000:.1f} | {med(rs, 'tasks'):.0f} | {len(rs[0]['hosts'])} |"
        )
    print()

    others = [p for p in st.placements if p != "colocated"]
    if others:
        print("### Placement (NodeKernel's shuffle)")
        print()
        print(
            "| job | storage servers | tier | job time s | runs s | against co-located DRAM | target |"
        )
        print("|---|---|---|---:|---|---:|---|")
        where = {
            "colocated": ("on the executors' hosts", "DRAM"),
            "disaggregated": ("on 3 hosts without executors", "DRAM"),
            "file": ("on the executors' hosts", "file"),
        }
        for job in st.placement_jobs:
            key = ("colocated", job, "nodekernel")
            if key not in by:
                continue
            base = med(by[key], "job_ms")
            for p in st.placements:
                rs = by.get((p, job, "nodekernel"))
                if not rs:
                    continue
                t = med(rs, "job_ms")
                ratio = tgt = ""
                if p != "colocated":
                    ratio = f"{t / base:.2f}x"
                if p == "disaggregated":
                    ok = max(t, base) <= 1.25 * min(t, base)
                    tgt = "within 1.25x: " + ("met" if ok else "**missed**")
                runs = " / ".join(f"{r['job_ms'] / 1000:.1f}" for r in rs)
                print(
                    f"| {WHAT[job]} | {where[p][0]} | {where[p][1]} | {t / 1000:.1f} | {runs} "
                    f"| {ratio} | {tgt} |"
                )
        print()


def main() -> None:
    st = Settings()
    if sys.argv[1] == "--tables":
        # The tables of an earlier run's results.jsonl (also a partial one).
        with open(sys.argv[2]) as f:
            tables(st, [json.loads(line) for line in f if line.strip()])
        return
    nk_bin, app, jars = sys.argv[1], sys.argv[2], sys.argv[3].split(":")
    out_dir = os.environ.get("OUT_DIR")
    results = os.path.join(out_dir, "results.jsonl") if out_dir else os.devnull
    with open(results, "w"):
        pass

    def save(rec: dict) -> None:
        with open(results, "a") as f:
            f.write(json.dumps(rec) + "\n")

    load_start = uptime()
    say(f"load at start: {load_start}")
    t0 = time.monotonic()
    records = []
    for p in st.placements:
        records += run_placement(st, p, nk_bin, jars, app, save)
    load_end = uptime()
    say(f"done in {time.monotonic() - t0:.0f} s; load at end: {load_end}")
    print(
        f"Medians of {st.runs} run(s) ({st.placement_runs} of the other layouts). Load at start: `{load_start}`; at end: `{load_end}`."
    )
    print()
    tables(st, records)


if __name__ == "__main__":
    main()

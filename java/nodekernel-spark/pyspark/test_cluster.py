"""A Spark standalone cluster over four hosts (network namespaces) with
NodeKernel under it, set up as docs/spark.md's "Running on a Spark
standalone cluster" tells a user (spark_cluster.py: which host runs what).

cluster_jobs.py runs groupByKey, reduceByKey, sortByKey, repartition, a
DataFrame groupBy, a SQL join with an aggregation, an AQE skew join and a join
at Spark's default 200 shuffle partitions, once with NodeKernel's shuffle
manager and once with Spark's default; both give the results computed here
in plain Python. The event logs say where each task ran: each job's map
tasks ran on at least two hosts, and its reduce tasks (on at least two hosts
but for the AQE-coalesced default job) read map output written on another
host. Then executor JVMs killed (kill -9) in the middle of a map stage and
of a reduce stage with NodeKernel's shuffle: the results are right and no
map task ran twice. Then the driver killed in the middle of a job: its
application's directory, bound to the driver's session, is removed by the
metadata server once the session's lease lapses, with no cleaner. Last, a storage server killed between two jobs
reading one shuffle: the second gets FetchFailed, Spark reruns the lost map
outputs, the result is right (the server is started again). Then a whole
host cut off from the network between those two jobs and back: the same
FetchFailed and rerun, then the host's store alive again with its blocks, a
new shuffle right, nothing left behind. Last, a Java application
(ClusterJob.java) started with spark-submit --class: its shuffles and an
NkBroadcast across the hosts.

On the Spark line NK_SPARK_LINE names (spark_cluster.LINE: 3.5_2.12, the
default, 3.5_2.13 or 4.0_2.13), run with the python of `scripts/pyspark-env.sh
LINE`; the fixture and the first test check that the master, the workers, the
driver and the executors run that line's Scala.

Needs root and `ip netns`: skipped with a notice without them, unless
NK_REQUIRE_NETNS=1. Every wait is bounded only to catch a hang."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

import netns
from cluster_jobs import KEYS, PARTS, N, expected_frames
from conftest import jar, py_tests
from spark_cluster import (
    DEFAULT_MANAGER,
    HANG_S,
    HERE,
    JARS,
    LINE,
    LINES,
    MANAGER,
    SCALA,
    SPARK_HOME,
    WORKERS,
    SparkCluster,
    Submitted,
    say,
    tasks_by_job_group,
    wait_for,
)


def open_scala_libraries(c: SparkCluster, main_class: str) -> list[list[str]]:
    """For each JVM of `main_class` in the hosts, the scala-library jars it
    has open: what its class loader read Scala's classes from."""
    found = []
    for h in c.hosts:
        for pid in c.net.pids(h):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if main_class.encode() not in f.read():
                        continue
                fds = os.listdir(f"/proc/{pid}/fd")
                paths = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
            except FileNotFoundError:
                continue  # exited meanwhile
            found.append(sorted(os.path.basename(p) for p in paths if "/scala-library-" in p))
    return found


@pytest.fixture(scope="module")
def spark_cluster(request):
    jars = [jar(j) for j in JARS]  # exits naming the build step when one is missing
    net = netns.Net.create(WORKERS + 1)
    if net is None:
        pytest.skip("needs root and ip netns (NK_REQUIRE_NETNS=1 fails instead)")
    say(f"Spark line {LINE}: SPARK_HOME {SPARK_HOME}, {os.path.basename(jars[0])}")
    c = SparkCluster(net, py_tests.nk_binary(), jars)
    failed = True
    try:
        c.start()
        # The master and the workers run the line's Scala (the executors:
        # test_jobs_across_hosts_match_the_default_shuffle).
        for main_class, n in (("deploy.master.Master", 1), ("deploy.worker.Worker", WORKERS)):
            libs = open_scala_libraries(c, main_class)
            say(f"  {main_class}: {libs}")
            assert len(libs) == n and all(
                len(js) == 1 and js[0].startswith(f"scala-library-{SCALA}.") for js in libs
            ), (main_class, libs)
        yield c
        failed = request.session.testsfailed > 0
    finally:
        say("teardown: every process in the hosts killed, namespaces deleted")
        c.close(keep=failed)


def expected() -> dict:
    """cluster_jobs.py's results, computed without Spark."""
    groups: dict[int, list[int]] = {}
    for i in range(N):
        groups.setdefault(i % KEYS, []).append(i)
    keyed = sorted(((i * 7919) % 10_007, i) for i in range(N))
    frame, joined = expected_frames(N, KEYS)
    skew: dict[int, int] = {}
    for v in range(N):
        k = 0 if v % 2 == 0 else v % 40
        skew[k] = skew.get(k, 0) + v
    digits: dict[int, tuple] = {}
    for v in range(60_000):
        if (v % 1_000) % 2 == 0:
            n, total = digits.get(v % 10, (0, 0))
            digits[v % 10] = (n + 1, total + v)
    return {
        "groupByKey": sorted([k, vs] for k, vs in groups.items()),
        "reduceByKey": sorted([k, sum(vs)] for k, vs in groups.items()),
        "sortByKey": [list(t) for t in keyed],
        "repartition": {"partitions": PARTS - 1, "values": list(range(N))},
        "dataframe": sorted([k, *t] for k, t in frame.items()),
        "sqlJoin": sorted([k, f"name{k}", *t] for k, t in joined.items()),
        "skewJoin": sorted([k, s] for k, s in skew.items()),
        "defaults": sorted([d, *t] for d, t in digits.items()),
    }


# The jobs of cluster_jobs.py that run through Spark SQL, whose reduce
# tasks adaptive query execution decides.
AQE_JOBS = {"dataframe", "sqlJoin", "skewJoin", "defaults"}


def check_placement(res: dict, worker_ips: set[str]) -> dict[str, tuple[set, set]]:
    """Each job's map tasks (shuffle records written) ran on two hosts or
    more and some reduce task (records read) on a host other than some map
    task's; the reduce tasks too on two or more, but for the SQL jobs,
    whose reduce tasks AQE makes: it coalesces small partitions into a few
    tasks (the job at Spark's defaults: its 200 into one; the skew join:
    the skewed one split besides), which may all run on one executor (the
    skew join on Spark 3.5 and the SQL join on Spark 4.0, once each in a
    full run)."""
    by_group = tasks_by_job_group(res["event_log"])
    seen = {}
    for job in expected():
        tasks = by_group.get(job, [])
        maps = {t["host"] for t in tasks if t["written"] > 0}
        reduces = {t["host"] for t in tasks if t["read"] > 0}
        where = f"{job}: map tasks on {sorted(maps)}, reduce tasks on {sorted(reduces)}"
        assert maps <= worker_ips and reduces <= worker_ips, where
        assert len(maps) >= 2, where
        assert reduces and any(r != m for r in reduces for m in maps), where
        if job not in AQE_JOBS:
            assert len(reduces) >= 2, where
        seen[job] = (maps, reduces)
    return seen


def test_jobs_across_hosts_match_the_default_shuffle(spark_cluster):
    """The jobs with NodeKernel's shuffle and with Spark's default give the
    results computed in plain Python, their tasks spread over the hosts. On
    the other Spark lines than the wheel's (NK_SPARK_LINE), NodeKernel's
    only: the default shuffle there is Spark's, not what is tested, and the
    test command's time is short."""
    c = spark_cluster
    want = expected()
    workers = {h.ip for h in c.hosts[:WORKERS]}

    say("spark-submit from host 3 with NodeKernel's shuffle manager")
    nk = c.run(True, "nk")
    apps = [("NodeKernel", nk, MANAGER)]
    if LINE == LINES[0]:
        say("spark-submit from host 3 with Spark's default shuffle")
        apps.append(("default", c.run(False, "default"), DEFAULT_MANAGER))

    for name, res, manager in apps:
        assert res["manager"] == manager
        # The driver and every executor ran the line's Scala and Spark.
        (scala, spark), executors = res["versions"]["driver"], res["versions"]["executors"]
        say(f"  driver: Scala {scala}, Spark {spark}; executors [host, Scala, Spark]: {executors}")
        assert scala.startswith(f"{SCALA}.") and spark.startswith(LINE.partition("_")[0] + ".")
        assert sorted(h for h, _, _ in executors) == sorted(workers), executors
        assert all(v == [scala, spark] for _, *v in executors), executors
        # The driver's host and the three executors' (one per worker).
        assert sorted(res["executor_hosts"]) == sorted([c.hosts[3].ip, *workers]), res[
            "executor_hosts"
        ]
        for job, rows in want.items():
            assert res["results"][job] == rows, f"{job} with the {name} shuffle"
        assert "skew" in res["plans"]["skewJoin"], res["plans"]["skewJoin"]
        # The defaults job's exchanges have Spark's 200 partitions.
        plan = res["plans"]["defaults"]
        assert re.search(r"hashpartitioning\([^)]*, 200\)", plan), plan
        for job, (maps, reduces) in check_placement(res, workers).items():
            say(f"  {name} {job}: maps on {sorted(maps)}, reduces on {sorted(reduces)}")
    # With NodeKernel no task failed and no stage ran twice (no fetch failure).
    tasks = [t for ts in tasks_by_job_group(nk["event_log"]).values() for t in ts]
    assert all(t["ok"] and t["attempt"] == 0 for t in tasks), [
        t for t in tasks if not t["ok"] or t["attempt"]
    ]

    # The shuffles were NodeKernel's while the application ran, and its
    # directory went with SparkContext.stop().
    assert nk["shuffle_dirs"] >= 1, nk
    r = c.nk("test", "-e", f"/spark-shuffle/{nk['app']}")
    assert r.returncode == 1, (r.returncode, r.stderr)


def kill_executor(c: SparkCluster, job: Submitted, markers: str, kind: str) -> tuple[int, str]:
    """kill -9 of the first executor JVM found running a task of `kind`
    (map: in its second map task, so one is finished; reduce: once its
    task has read the shuffle input, and only an executor that wrote map
    output of that job); its host, and for a reduce task the partition it
    was in."""

    def victim():
        runs: dict[str, dict[int, list[str]]] = {}
        for name in os.listdir(markers):
            k, partition, pid = name.split("-")
            runs.setdefault(k, {}).setdefault(int(pid), []).append(partition)
        for pid, partitions in runs.get(kind, {}).items():
            if kind == "map" and len(partitions) >= 2:
                return pid, sorted(partitions, key=int)
            if kind == "reduce" and pid in runs.get("shuffled", {}):
                return pid, sorted(partitions, key=int)
        return None

    pid, partitions = wait_for(f"an executor in a {kind} task", victim, job.proc, job.log)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert b"CoarseGrainedExecutorBackend" in f.read(), f"{pid} is no executor"
    host = next(h.index for h in c.hosts if pid in c.net.pids(h))
    os.kill(pid, signal.SIGKILL)
    say(f"  kill -9 of the executor on host {host} (pid {pid}), {kind} tasks {partitions} started")
    return host, partitions[0]


def check_executor_lost(tasks: list[dict], maps: int, reduces: int) -> set[str]:
    """A task was lost with the killed executor; every map task succeeded
    exactly once, in its stage's first attempt, the lost executor's
    finished ones among them (their outputs were read, not recomputed);
    every reduce task succeeded. The lost executors' ids."""
    lost = {t["executor"] for t in tasks if t["reason"] == "ExecutorLostFailure"}
    assert lost, f"no task was lost with the executor: {tasks}"
    map_tasks = [t for t in tasks if t["type"] == "ShuffleMapTask"]
    done = [t for t in map_tasks if t["ok"]]
    assert sorted(t["index"] for t in done) == list(range(maps)), map_tasks
    assert all(t["attempt"] == 0 for t in map_tasks), map_tasks
    assert any(t["executor"] in lost for t in done), (lost, map_tasks)
    result = [t for t in tasks if t["type"] == "ResultTask" and t["ok"]]
    assert sorted(t["index"] for t in result) == list(range(reduces)), result
    return lost


def test_executors_killed_in_map_and_reduce_stages_keep_their_map_outputs(spark_cluster):
    """kill -9 of an executor JVM in the middle of a map stage, then of
    another in the middle of a reduce stage, with NodeKernel's shuffle: the
    lost tasks run again elsewhere, the results are right and no map task
    ran twice (the map outputs are in NodeKernel, so Spark keeps those of
    the dead executors: supportsReliableStorage)."""
    c = spark_cluster
    markers = c.path("task-markers")
    os.makedirs(markers)
    say("spark-submit with NodeKernel's shuffle: groupByKeys with slow map, then reduce tasks")
    job = c.submit(True, "executor-lost", "--executor-loss", markers)
    kill_executor(c, job, markers, "map")
    _, partition = kill_executor(c, job, markers, "reduce")
    res = job.result()
    say(f"  done ({res['app']})")

    sums: dict[int, int] = {}
    for i in range(N):
        sums[i % KEYS] = sums.get(i % KEYS, 0) + i
    want = sorted([k, v] for k, v in sums.items())
    assert res["results"]["executorLostInMap"] == want
    assert res["results"]["executorLostInReduce"] == want

    by_group = tasks_by_job_group(res["event_log"])
    lost = check_executor_lost(by_group["executorLostInMap"], 9, 4)
    say(f"  map stage: executor {sorted(lost)} lost, its finished map tasks not run again")
    tasks = by_group["executorLostInReduce"]
    lost = check_executor_lost(tasks, 6, 9)
    # The killed reduce task finished on another executor.
    assert all(
        t["executor"] not in lost
        for t in tasks
        if t["type"] == "ResultTask" and t["ok"] and t["index"] == int(partition)
    )
    say(f"  reduce stage: executor {sorted(lost)} lost, its map outputs read by the others")
    r = c.nk("test", "-e", f"/spark-shuffle/{res['app']}")
    assert r.returncode == 1, (r.returncode, r.stderr)


def stored_bytes(c: SparkCluster, path: str = "/") -> int:
    """What the nodes under `path` take of the cluster (`nk du --stored`)."""
    r = c.nk("du", "-s", "--stored", "--json", path)
    assert r.returncode == 0, r.stderr
    return sum(e["stored"] for e in json.loads(r.stdout))


def used_by_server(c: SparkCluster) -> dict[str, int]:
    """The bytes each storage server's blocks in use take (`nk status`)."""
    return {s["addr"]: s["used_bytes"] for s in c.status()["servers"]}


ROOT = "/spark-shuffle"  # the application directories' parent (made by the first driver)


def stored_before_an_application(c: SparkCluster) -> int:
    """stored_bytes of the whole namespace, with the root of the application
    directories as a driver leaves it (made by the first application; here
    if a test runs alone)."""
    r = c.nk("mkdir", "-p", ROOT)
    assert r.returncode == 0, r.stderr
    return stored_bytes(c)


DRIVER_TIMEOUT_S = 10


def test_driver_killed_its_shuffle_data_removed_with_its_session(spark_cluster):
    """kill -9 of the driver JVM in the middle of a map stage: its
    application's directory is bound to the driver's session (lease
    spark.nodekernel.shuffle.driverTimeout), which nobody renews any more, so
    the metadata server removes it once the lease lapses (docs/spark.md,
    "Driver loss"): no cleaner is needed, and what the application took of
    the cluster is free again."""
    c = spark_cluster
    markers = c.path("driver-loss-markers")
    os.makedirs(markers)
    before = stored_before_an_application(c)
    say(f"spark-submit with NodeKernel's shuffle, driverTimeout {DRIVER_TIMEOUT_S} s; 9 slow maps")
    job = c.submit(
        True,
        "driver-lost",
        "--driver-loss",
        markers,
        conf={"spark.nodekernel.shuffle.driverTimeout": f"{DRIVER_TIMEOUT_S}s"},
    )
    # Four map tasks started: the first wave's three have written output.
    wait_for("map tasks", lambda: len(os.listdir(markers)) >= 4, job.proc, job.log)
    driver = [
        pid
        for pid in c.net.pids(c.hosts[3])
        if b"org.apache.spark.deploy.SparkSubmit" in open(f"/proc/{pid}/cmdline", "rb").read()
    ]
    assert len(driver) == 1, driver
    with open(job.log, errors="replace") as f:
        app = re.search(r"app-\d+-\d+", f.read()).group(0)
    app_dir = f"{ROOT}/{app}"
    # While the driver lives (and renews its session) its data is there.
    left = stored_bytes(c, app_dir)
    assert left > 0, left
    os.kill(driver[0], signal.SIGKILL)
    killed = time.monotonic()
    say(
        f"  kill -9 of the driver (pid {driver[0]}, {app}) with {len(os.listdir(markers))} maps"
        f" started; {app_dir} held {left} bytes"
    )
    job.proc.wait(timeout=HANG_S)
    # Removed by the metadata server once the lease lapses (bounded only to
    # catch a hang); nothing else is needed.
    wait_for(f"{app_dir} removed", lambda: c.nk("test", "-e", app_dir).returncode == 1)
    say(f"  {app_dir} removed {time.monotonic() - killed:.1f} s after the kill")
    assert c.nk("test", "-e", f"{ROOT}/.drivers").returncode == 1, "no lease KeyValues"
    after = stored_bytes(c)
    say(f"  stored bytes of the cluster: {before} before the application, {after} after")
    assert after == before, (after, before)


def test_storage_server_killed_reduce_stage_refetches_rerun_maps(spark_cluster):
    """kill -9 of one host's `nk store` after a shuffle's map stage: the
    next job reading that shuffle gets FetchFailed for the outputs the dead
    server held, Spark runs the map stage again (a second attempt) for
    them, and the result is right. The store is started again (empty) for
    the tests after this one."""
    c = spark_cluster
    markers = c.path("store-loss-markers")
    os.makedirs(markers)
    say("spark-submit with NodeKernel's shuffle: a reduceByKey read by two jobs")
    job = c.submit(True, "store-lost", "--store-loss", markers)
    wait_for(
        "the first job", lambda: os.path.exists(os.path.join(markers, "mapped")), job.proc, job.log
    )
    victim = busiest_host(c, markers)
    ip = c.hosts[victim].ip
    os.kill(c.stores[victim].pid, signal.SIGKILL)
    say(f"  kill -9 of nk store on host {victim} ({ip})")
    wait_for("the metadata server to mark the store dead", lambda: c.alive_stores() == WORKERS - 1)
    open(os.path.join(markers, "go"), "w").close()
    try:
        res = job.result()
    finally:
        say(f"  nk store on host {victim} started again")
        c.start_store(victim)
        wait_for("three live storage servers", lambda: c.alive_stores() >= WORKERS)
    say(f"  done ({res['app']})")

    check_lost_outputs_rerun(c, res, "storeLost", ip)


def busiest_host(c: SparkCluster, markers: str) -> int:
    """The host (of 1 and 2) whose executor wrote most of store_loss's map
    outputs (its map tasks' `shuffled-<partition>-<pid>` in `markers`)."""
    counts = {1: 0, 2: 0}
    for name in os.listdir(markers):
        if name.startswith("shuffled-"):
            pid = int(name.split("-")[2])
            for i in counts:
                if pid in c.net.pids(c.hosts[i]):
                    counts[i] += 1
    say(f"  map tasks by host: {counts}")
    return max(counts, key=counts.get)


def summed() -> list[list[int]]:
    """The reduceByKey of store_loss and host_cut (cluster_jobs.py)."""
    sums: dict[int, int] = {}
    for i in range(N):
        sums[i % KEYS] = sums.get(i % KEYS, 0) + i
    return sorted([k, v] for k, v in sums.items())


def check_lost_outputs_rerun(c: SparkCluster, res: dict, group: str, ip: str) -> None:
    """store_loss's second job (group `group`) got FetchFailed, the map
    outputs first written on host `ip` were written again by a rerun of the
    map stage, both jobs' results are right, and the application's directory
    went with it."""
    want = summed()
    assert res["results"][f"{group}Before"] == want
    assert res["results"][group] == want, res["results"][f"{group}Outputs"]

    tasks = tasks_by_job_group(res["event_log"])[group]
    maps = [t for t in tasks if t["type"] == "ShuffleMapTask"]
    first = [t for t in maps if t["attempt"] == 0 and t["ok"]]
    rerun = [t for t in maps if t["attempt"] >= 1 and t["ok"]]
    fetch_failed = [t for t in tasks if t["reason"] == "FetchFailed"]
    say(
        f"  {len(fetch_failed)} reduce tasks FetchFailed; map tasks rerun: "
        f"{sorted(t['index'] for t in rerun)} (first run on the lost host: "
        f"{sorted(t['index'] for t in first if t['host'] == ip)})"
    )
    assert fetch_failed, tasks
    assert rerun, maps
    # Every map output written on the lost host was written again.
    assert {t["index"] for t in first if t["host"] == ip} <= {t["index"] for t in rerun}, maps
    r = c.nk("test", "-e", f"/spark-shuffle/{res['app']}")
    assert r.returncode == 1, (r.returncode, r.stderr)


def test_a_host_cut_off_and_back(spark_cluster):
    """A whole host (worker, executor and storage server) cut off from the
    network after a shuffle's map stage, its processes left running: once
    the metadata server holds its store dead and the driver its executor
    lost, the next job reading that shuffle gets FetchFailed for the outputs
    the host held, Spark reruns those maps elsewhere, the result is right.
    With the link back, the store is alive again with what it held (a file
    put there before the cut reads back), a new shuffle job is right, and
    the application leaves nothing behind."""
    c = spark_cluster
    markers = c.path("host-cut-markers")
    os.makedirs(markers)
    before = stored_before_an_application(c)
    used_before = used_by_server(c)
    say("spark-submit with NodeKernel's shuffle: a reduceByKey read by two jobs, then another")
    # The driver gives up on a silent executor after 20 s, not the default 120.
    job = c.submit(
        True,
        "host-cut",
        "--host-cut",
        markers,
        conf={
            "spark.network.timeout": "20s",
            "spark.executor.heartbeatInterval": "2s",
            "spark.network.timeoutInterval": "2s",
        },
    )
    wait_for(
        "the first job", lambda: os.path.exists(os.path.join(markers, "mapped")), job.proc, job.log
    )
    victim = busiest_host(c, markers)
    host = c.hosts[victim]
    # A file on the host's store (written there), to read back once it is back.
    probe = c.path("probe")
    with open(probe, "wb") as f:
        f.write(os.urandom(3 << 19))
    r = subprocess.run(
        host.argv(c.nk_bin, "put", "--local-placement", probe, "/probe"),
        capture_output=True,
        text=True,
        env=c.env(victim),
        timeout=HANG_S,
    )
    assert r.returncode == 0, r.stderr
    probe_bytes = stored_bytes(c, "/probe")

    c.net.cut(host)
    cut = time.monotonic()
    say(f"  host {victim} ({host.ip}) cut off: worker, executor and nk store left running")
    wait_for("the metadata server to hold the store dead", lambda: c.alive_stores() == WORKERS - 1)
    lost = re.compile(rf"Lost executor \S+ on {re.escape(host.ip)}")
    wait_for(
        "the driver to lose the executor",
        lambda: lost.search(open(job.log, errors="replace").read()),
        job.proc,
        job.log,
    )
    say(f"  store dead and executor lost after {time.monotonic() - cut:.0f} s")
    open(os.path.join(markers, "go"), "w").close()
    wait_for(
        "the second job", lambda: os.path.exists(os.path.join(markers, "read")), job.proc, job.log
    )
    c.net.mend(host)
    say(f"  link back after {time.monotonic() - cut:.0f} s")
    wait_for("three live storage servers", lambda: c.alive_stores() == WORKERS)
    back = subprocess.run(
        c.hosts[3].argv(c.nk_bin, "get", "/probe", "-"),
        capture_output=True,
        env=c.env(3),
        timeout=HANG_S,
    )
    assert back.returncode == 0, back.stderr
    with open(probe, "rb") as f:
        assert back.stdout == f.read(), "the file put on the host before the cut"
    say("  the store is back with its blocks: the file put before the cut reads back")
    open(os.path.join(markers, "mended"), "w").close()
    res = job.result()
    say(f"  done ({res['app']})")

    check_lost_outputs_rerun(c, res, "hostCut", host.ip)
    assert res["results"]["hostBack"] == summed()
    # What the application took of the cluster, on every host, is free again.
    assert stored_bytes(c) == before + probe_bytes, (before, probe_bytes)
    assert c.nk("rm", "/probe").returncode == 0
    assert stored_bytes(c) == before
    # And no block of the application is left in use (blocks clients
    # reserved ahead come back once those clients are gone).
    blocks_free_again(c, used_before)


def blocks_free_again(c: SparkCluster, used_before: dict[str, int]) -> None:
    """Waits until the storage servers' blocks in use are no more than
    `used_before`'s plus a block for each directory that stays (`/`, the
    applications' root): the child records of those that were on the cut
    host while it was dead were written again elsewhere, in a block of
    their own, so each server's use, and the total, may differ from
    before by that much, never by what the application held. If that
    hangs, says what still holds them: the servers' use, the puts in
    progress or reserved, and the executors still running."""
    st = c.status() or {}
    block = st.get("block_size", 0)
    containers = json.loads(c.nk("du", "/", "--json").stdout)[-1]["containers"]

    def free() -> bool:
        used = sum(used_by_server(c).values())
        return used <= sum(used_before.values()) + containers * block

    try:
        wait_for("the application's blocks free again", free)
    except TimeoutError as e:
        st = c.status() or {}
        executors = {
            i: [pid for pid in c.net.pids(h) if "CoarseGrainedExecutorBackend" in cmdline(pid)]
            for i, h in enumerate(c.hosts)
        }
        raise TimeoutError(
            f"{e}: used now {used_by_server(c)}, before {used_before}; puts in progress "
            f"{st.get('puts_in_progress')}, reserved {st.get('reserved_puts')}, reclaiming "
            f"{st.get('reclaiming')}; executors still running by host {executors}"
        ) from None


def cmdline(pid: int) -> str:
    """Process `pid`'s command line ('' once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def java_app(c: SparkCluster) -> str:
    """ClusterJob.java compiled against the cluster's Spark and NodeKernel's
    jars, in a jar of its own: a user's Java application."""
    out = c.path("java-app")
    classes = os.path.join(out, "classes")
    os.makedirs(classes)
    cp = ":".join([str(SPARK_HOME / "jars" / "*"), *c.jars])
    r = subprocess.run(
        ["javac", "-d", classes, "-cp", cp, str(HERE / "ClusterJob.java")],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert r.returncode == 0, r.stderr
    app = os.path.join(out, "cluster-job.jar")
    subprocess.run(["jar", "cf", app, "-C", classes, "."], check=True, timeout=HANG_S)
    return app


def test_a_java_application_from_spark_submit(spark_cluster):
    """A Java application, compiled and started with `spark-submit --class`
    as docs/spark.md tells a user: its reduceByKey, groupByKey and sortByKey
    on NodeKernel's shuffle give the right results, their reduce tasks
    reading map output written on other hosts, and every task of a job over
    the executors reads its NkBroadcast."""
    c = spark_cluster
    app = java_app(c)
    say("spark-submit --class of a Java application with NodeKernel's shuffle")
    job = c.submit(
        True, "java", str(N), str(KEYS), java=("io.nodekernel.clustertest.ClusterJob", app)
    )
    res = job.result()
    say(f"  done ({res['app']})")
    assert res["manager"] == MANAGER
    want = expected()
    assert res["javaReduceByKey"] == want["reduceByKey"]
    assert res["javaGroupByKey"] == want["groupByKey"]
    assert res["javaSortByKey"] == want["sortByKey"]
    b = res["javaBroadcast"]
    assert b["got"] == [b["want"]] * 6, b

    workers = {h.ip for h in c.hosts[:WORKERS]}
    by_group = tasks_by_job_group(res["event_log"])
    for job_name in ("javaReduceByKey", "javaGroupByKey", "javaSortByKey"):
        tasks = by_group[job_name]
        maps = {t["host"] for t in tasks if t["written"] > 0}
        reduces = {t["host"] for t in tasks if t["read"] > 0}
        where = f"{job_name}: map tasks on {sorted(maps)}, reduce tasks on {sorted(reduces)}"
        say(f"  {where}")
        assert maps <= workers and reduces <= workers, where
        # Reduce tasks read map output written on another host (short tasks
        # may all run on one executor, as they were offered).
        assert len(maps) >= 2, where
        assert reduces and any(r != m for r in reduces for m in maps), where
        assert all(t["ok"] and t["attempt"] == 0 for t in tasks), where
    assert len({t["host"] for t in by_group["javaBroadcast"]}) >= 2, by_group["javaBroadcast"]
    r = c.nk("test", "-e", f"/spark-shuffle/{res['app']}")
    assert r.returncode == 1, (r.returncode, r.stderr)

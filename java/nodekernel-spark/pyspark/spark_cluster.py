"""The Spark standalone cluster of test_cluster.py (and of the cluster
benchmark, scripts/bench-spark-cluster.sh) over network-namespace hosts
(netns.py), with NodeKernel under it, set up as docs/spark.md's "Running on
a Spark standalone cluster" tells a user:

    host 0: nk meta, nk store, Spark master, Spark worker
    host 1: nk store, Spark worker
    host 2: nk store, Spark worker
    host 3: the driver (spark-submit --master spark://host0:7077, client mode)

Each worker has one core and runs one executor (512 MiB); each storage server
has 256 MiB of DRAM and no file tier. The cluster is secure by default: one
cluster token, named in every host's client configuration (NK_CONFIG).
Spark is that of the Spark line NK_SPARK_LINE names (LINE below; its
bin/spark-class starts the master and workers), with the jars of that line
that scripts/java.sh built.

No pytest here: the jars and the nk binary are found by the caller
(conftest.jar, py_tests.nk_binary) and passed in. Every wait is bounded only
to catch a hang."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pyspark

import netns

HANG_S = 600  # only catches a hang: a JVM on a loaded 2-core machine is slow
HERE = pathlib.Path(__file__).resolve().parent
# The Spark line (docs/spark.md, "Which jar goes with which Spark"): NK_SPARK_LINE,
# run by the python of the venv `scripts/pyspark-env.sh LINE` makes. 3.5_2.12 (the
# default) and 4.0_2.13: the pyspark wheel's Spark, SPARK_HOME its package
# directory; 3.5_2.13: the SPARK_HOME pyspark-env.sh assembles in the venv (Spark's
# _2.13 jars of the wheel's version, the wheel's scripts and Python).
LINES = ("3.5_2.12", "3.5_2.13", "4.0_2.13")
LINE = os.environ.get("NK_SPARK_LINE", LINES[0])
SCALA = LINE.partition("_")[2]  # the Scala binary version


def _spark_home() -> pathlib.Path:
    wheel = pathlib.Path(pyspark.__file__).resolve().parent
    home = pathlib.Path(sys.prefix) / f"spark-{LINE}" if LINE == "3.5_2.13" else wheel
    scala = [p.name for p in home.glob("jars/scala-library-*.jar")]
    spark = LINE.partition("_")[0]
    if not (
        LINE in LINES
        and pyspark.__version__.startswith(f"{spark}.")
        and len(scala) == 1
        and scala[0].startswith(f"scala-library-{SCALA}.")
    ):
        raise RuntimeError(
            f"NK_SPARK_LINE={LINE} (one of {', '.join(LINES)}) but {sys.executable} has "
            f"pyspark {pyspark.__version__} and {home}/jars {scala or 'no scala-library'}: "
            f"run with the python of `scripts/pyspark-env.sh {LINE}`"
        )
    return home


SPARK_HOME = _spark_home()
MANAGER = "io.nodekernel.spark.NodeKernelShuffleManager"
DEFAULT_MANAGER = "org.apache.spark.shuffle.sort.SortShuffleManager"
META_PORT = 9060
STORE_PORT = 9070
MASTER_PORT = 7077
WORKERS = 3  # hosts 0..2; the driver runs on host 3
STORE_DRAM = "256MiB"
# docs/spark.md: the jar of this Spark's line, the client (it carries the
# native library) and the Hadoop FileSystem, on both extraClassPaths.
JARS = (
    f"nodekernel-spark/spark-{LINE}/target/nodekernel-spark-{LINE}-VERSION.jar",
    "nodekernel-client/target/nodekernel-client-VERSION.jar",
    "nodekernel-hadoop/target/nodekernel-hadoop-VERSION.jar",
)


def say(msg: str) -> None:
    """What the test is doing (pytest -s shows it as it happens)."""
    print(f"[spark cluster] {msg}", file=sys.stderr, flush=True)


def wait_for(what: str, cond, proc: subprocess.Popen | None = None, log: str | None = None):
    deadline = time.monotonic() + HANG_S
    while True:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode}){tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}{tail(log)}")
        time.sleep(0.2)


def tail(log: str | None, n: int = 4000) -> str:
    if not log or not os.path.exists(log):
        return ""
    with open(log, errors="replace") as f:
        return f"\n--- {log} ---\n{f.read()[-n:]}"


def log_has(log: str, text: str) -> bool:
    with open(log, errors="replace") as f:
        return text in f.read()


class Submitted:
    """A running spark-submit of cluster_jobs.py."""

    def __init__(self, cluster, name: str, proc: subprocess.Popen, out: str, log: str):
        self.cluster, self.name, self.proc, self.out, self.log = cluster, name, proc, out, log

    def result(self) -> dict:
        """Waits for the application's end: its JSON output, with the path
        of its event log."""
        try:
            rc = self.proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        if rc != 0:
            raise AssertionError(
                f"spark-submit ({self.name}) exited {rc}{tail(self.log, 12000)}"
                f"{self.cluster.executor_logs()}"
            )
        with open(self.out) as f:
            res = json.load(f)
        res["event_log"] = os.path.join(self.cluster.events, res["app"])
        return res


class SparkCluster:
    """The hosts and what runs on them; see the module docs."""

    def __init__(
        self,
        net: netns.Net,
        nk_bin: str,
        jars: list[str],
        *,
        store_hosts: tuple[int, ...] = tuple(range(WORKERS)),
        store_medium: str = "dram",
        store_size: str = STORE_DRAM,
        executor_memory: str = "512m",
        driver_memory: str = "512m",
        worker_memory: str = "1g",
        worker_opts: str | None = None,
    ):
        """The keyword arguments, for the benchmark (their defaults are the
        test's cluster): the hosts that run a storage server (host 0 runs
        `nk meta` whichever they are), each server's medium ("dram", or
        "file": a file tier, its block file in the server's data directory
        under the cluster's temporary one) and size, the
        executors', driver's and workers' memory, and SPARK_WORKER_OPTS of
        the workers (e.g. `-Dspark.shuffle.service.enabled=true`: Spark's
        external shuffle service in each worker)."""
        self.net = net
        self.store_hosts = store_hosts
        self.store_medium, self.store_size = store_medium, store_size
        self.executor_memory, self.driver_memory = executor_memory, driver_memory
        self.worker_memory, self.worker_opts = worker_memory, worker_opts
        self.jars = jars
        self.hosts = net.hosts
        self.dir = tempfile.mkdtemp(prefix="nk-spark-cluster-")
        self.nk_bin = nk_bin
        self.meta = f"{self.hosts[0].ip}:{META_PORT}"
        self.master = f"spark://{self.hosts[0].ip}:{MASTER_PORT}"
        self.events = os.path.join(self.dir, "events")
        os.makedirs(self.events)
        self.token = os.path.join(self.dir, "token")
        subprocess.run([self.nk_bin, "token", "new", self.token], check=True, capture_output=True)
        # An empty configuration directory: no spark-defaults.conf of the
        # machine's leaks in.
        self.spark_conf_dir = os.path.join(self.dir, "spark-conf")
        os.makedirs(self.spark_conf_dir)
        for h in self.hosts:
            with open(self.client_config(h.index), "w") as f:
                f.write(self._client_section(h))

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def client_config(self, host: int) -> str:
        """Host `host`'s client configuration (what /etc/nodekernel would
        hold on a real host): the metadata server, this host's location, the
        cluster token."""
        return self.path(f"client-h{host}.toml")

    def _client_section(self, h: netns.Host) -> str:
        return (
            f'[client]\nmeta = ["{self.meta}"]\ntimeout_ms = {HANG_S * 1000}\n'
            f'location = "{h.ip}"\n[security]\ntoken_file = "{self.token}"\n'
        )

    def env(self, host: int, **extra: str) -> dict[str, str]:
        """The environment of a process on `host`: this machine's, without
        any cluster or Spark settings of its own."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("NK_", "SPARK_", "PYSPARK_")) and k != "JAVA_TOOL_OPTIONS"
        }
        run = self.path(f"run-h{host}")
        os.makedirs(run, exist_ok=True)
        env.update(
            NK_RUNTIME_DIR=run,
            NK_CONFIG=self.client_config(host),
            SPARK_HOME=str(SPARK_HOME),
            SPARK_CONF_DIR=self.spark_conf_dir,
            SPARK_LOCAL_IP=self.hosts[host].ip,
            SPARK_LOG_DIR=self.path(f"spark-logs-h{host}"),
            SPARK_LOCAL_DIRS=self.path(f"spark-local-h{host}"),
            PYSPARK_PYTHON=sys.executable,
        )
        env.update(extra)
        return env

    def spawn(self, host: int, name: str, argv: list[str], **env: str):
        log = self.path(f"{name}.log")
        p = self.net.spawn(self.hosts[host], argv, log, self.env(host, **env))
        return p, log

    def start(self) -> None:
        h0 = self.hosts[0]
        meta_cfg = self.path("meta.toml")
        with open(meta_cfg, "w") as f:
            # A host may be away (cut off) ten minutes and come back with its
            # blocks, as docs/deployment.md's examples set it.
            f.write(f'[meta]\nretire_after_ms = 600000\n[security]\ntoken_file = "{self.token}"\n')
        say(f"host 0 ({h0.ip}): nk meta on {self.meta}")
        p, log = self.spawn(
            0, "meta", [self.nk_bin, "meta", "--listen", self.meta, "--config", meta_cfg]
        )
        wait_for("nk meta", lambda: log_has(log, "metadata server listening on"), p, log)
        self.stores: dict[int, subprocess.Popen] = {}
        for i in self.store_hosts:
            say(f"host {i}: nk store, {self.store_size} of {self.store_medium}")
            self.start_store(i)
        n = len(self.store_hosts)
        wait_for(f"{n} live storage servers", lambda: self.alive_stores() >= n)

        say(f"host 0: Spark master at {self.master}")
        p, master_log = self.spawn(
            0,
            "spark-master",
            [
                str(SPARK_HOME / "bin" / "spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                h0.ip,
                "--port",
                str(MASTER_PORT),
                "--webui-port",
                "8080",
            ],
            SPARK_DAEMON_MEMORY="256m",
        )
        wait_for("the Spark master", lambda: log_has(master_log, "New state: ALIVE"), p, master_log)
        worker_env = {"SPARK_DAEMON_MEMORY": "256m"}
        if self.worker_opts:
            worker_env["SPARK_WORKER_OPTS"] = self.worker_opts
        for i in range(WORKERS):
            h = self.hosts[i]
            say(f"host {i}: Spark worker, 1 core")
            self.spawn(
                i,
                f"spark-worker-h{i}",
                [
                    str(SPARK_HOME / "bin" / "spark-class"),
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    h.ip,
                    "--cores",
                    "1",
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    self.path(f"spark-work-h{i}"),
                    "--webui-port",
                    "8081",
                    self.master,
                ],
                **worker_env,
            )

        def registered() -> bool:
            with open(master_log, errors="replace") as f:
                return len(set(re.findall(r"Registering worker (\S+)", f.read()))) >= WORKERS

        wait_for("three Spark workers registered", registered, p, master_log)

    def start_store(self, i: int) -> None:
        """Host i's storage server (again, after a kill: its DRAM tier is
        volatile, so it comes back empty, with its identity)."""
        h = self.hosts[i]
        cfg = self.path(f"store-h{i}.toml")
        with open(cfg, "w") as f:
            f.write(
                self._client_section(h)
                + f'[[store]]\nclass = 0\nclass_name = "{self.store_medium}"\n'
                f'medium = "{self.store_medium}"\n'
                f'size = "{self.store_size}"\nlisten = "{h.ip}:{STORE_PORT}"\n'
                f'location = "{h.ip}"\ndata_dir = "{self.path(f"store-h{i}")}"\n'
            )
        log = self.path(f"store-h{i}.log")
        start = os.path.getsize(log) if os.path.exists(log) else 0

        def up() -> bool:
            with open(log, errors="replace") as f:
                f.seek(start)
                return "storage server 0" in f.read()

        p, log = self.spawn(i, f"store-h{i}", [self.nk_bin, "store", "--config", cfg])
        wait_for(f"nk store on host {i}", up, p, log)
        self.stores[i] = p

    def status(self) -> dict | None:
        r = self.nk("status", "--json")
        return json.loads(r.stdout) if r.returncode == 0 else None

    def alive_stores(self) -> int:
        st = self.status()
        return st["alive_servers"] if st else -1

    def submit(
        self,
        nodekernel: bool,
        name: str,
        *job_args: str,
        conf: dict[str, str] | None = None,
        java: tuple[str, str] | None = None,
    ) -> Submitted:
        """Starts cluster_jobs.py from host 3 with spark-submit (client mode),
        with the Spark settings `conf` too; `java`: (main class, application
        jar) of a Java application to start instead (its arguments: the
        output file, the number of executors, `job_args`)."""
        out = self.path(f"jobs-{name}.json")
        argv = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            self.master,
            "--deploy-mode",
            "client",
            "--name",
            f"cluster-jobs-{name}",
            "--driver-memory",
            self.driver_memory,
            "--executor-memory",
            self.executor_memory,
            "--total-executor-cores",
            str(WORKERS),
            "--conf",
            f"spark.driver.host={self.hosts[3].ip}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.eventLog.enabled=true",
            "--conf",
            f"spark.eventLog.dir=file://{self.events}",
            # One uncompressed file: Spark 4.0 rolls event logs into a directory
            # (eventlog_v2_<app>) and compresses them by default.
            "--conf",
            "spark.eventLog.rolling.enabled=false",
            "--conf",
            "spark.eventLog.compress=false",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
        ]
        for k, v in (conf or {}).items():
            argv += ["--conf", f"{k}={v}"]
        args = [out, str(WORKERS), *job_args]
        if nodekernel:
            # docs/spark.md, "Running on a Spark standalone cluster".
            jars = ":".join(self.jars)
            argv += [
                "--driver-class-path",
                jars,
                "--conf",
                f"spark.executor.extraClassPath={jars}",
                "--conf",
                f"spark.shuffle.manager={MANAGER}",
                "--conf",
                f"spark.nodekernel.meta={self.meta}",
            ]
            if java is None:
                args += ["--nk", self.nk_bin]
        if java is None:
            argv += [str(HERE / "cluster_jobs.py"), *args]
        else:
            argv += ["--class", java[0], java[1], *args]
        log = self.path(f"driver-{name}.log")
        p = self.net.spawn(self.hosts[3], argv, log, self.env(3))
        return Submitted(self, name, p, out, log)

    def run(self, nodekernel: bool, name: str, *job_args: str) -> dict:
        """cluster_jobs.py to its end (see Submitted.result)."""
        t0 = time.monotonic()
        res = self.submit(nodekernel, name, *job_args).result()
        say(f"  done in {time.monotonic() - t0:.0f} s ({res['app']})")
        return res

    def executor_logs(self) -> str:
        logs = sorted(pathlib.Path(self.dir).glob("spark-work-h*/app-*/*/stderr"))
        return "".join(tail(str(p), 3000) for p in logs[-6:])

    def nk(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.hosts[3].argv(self.nk_bin, *args),
            capture_output=True,
            text=True,
            env=self.env(3),
            timeout=HANG_S,
        )

    def close(self, keep: bool) -> None:
        self.net.close()
        if keep:
            say(f"logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def read_event_log(event_log: str) -> tuple[list[dict], dict[int, str | None]]:
    """An application's event log: its events, and the job group of each
    stage (the spark.jobGroup.id of the job it ran in; None without one)."""
    events: list[dict] = []
    group_of_stage: dict[int, str | None] = {}
    with open(event_log) as f:
        for line in f:
            ev = json.loads(line)
            events.append(ev)
            if ev["Event"] == "SparkListenerJobStart":
                group = (ev.get("Properties") or {}).get("spark.jobGroup.id")
                for s in ev["Stage IDs"]:
                    group_of_stage[s] = group
    return events, group_of_stage


def tasks_by_job_group(event_log: str) -> dict[str, list[dict]]:
    """The finished tasks of each job group (cluster_jobs.py names one per
    job), from the application's event log."""
    events, group_of_stage = read_event_log(event_log)
    tasks = []
    for ev in events:
        if ev["Event"] == "SparkListenerTaskEnd":
            m = ev.get("Task Metrics") or {}
            tasks.append(
                {
                    "stage": ev["Stage ID"],
                    "attempt": ev["Stage Attempt ID"],
                    "type": ev["Task Type"],
                    # The partition (a stage's rerun numbers its tasks from 0).
                    "index": ev["Task Info"].get("Partition ID", ev["Task Info"]["Index"]),
                    "host": ev["Task Info"]["Host"],
                    "executor": ev["Task Info"]["Executor ID"],
                    "reason": ev["Task End Reason"]["Reason"],
                    "ok": ev["Task End Reason"]["Reason"] == "Success",
                    "read": m.get("Shuffle Read Metrics", {}).get("Total Records Read", 0),
                    "written": m.get("Shuffle Write Metrics", {}).get("Shuffle Records Written", 0),
                }
            )
    out: dict[str, list[dict]] = {}
    for t in tasks:
        out.setdefault(group_of_stage.get(t["stage"]), []).append(t)
    return out

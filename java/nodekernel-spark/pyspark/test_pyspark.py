"""PySpark from the `pyspark` wheel (Spark 3.5, Scala 2.12, as `pip install
pyspark` gives it) with NodeKernel's shuffle manager and `nk://`, set up as
docs/spark.md tells a user: the Scala 2.12 jar, the client and the Hadoop
FileSystem on the driver's and executors' extraClassPath, through
`SparkSession.builder.config(...)` or `PYSPARK_SUBMIT_ARGS`.

DataFrame jobs (a groupBy, a join with an aggregation) give the results of
Spark's default shuffle and of plain Python; their shuffle data is in
NodeKernel (the application's directory under the shuffle root, a map index
per map task, no shuffle file in spark.local.dir) and gone after stop(); a
Parquet table is written to and read from nk://. The Scala 2.13 jar on this
Scala 2.12 Spark fails at once with the name of the jar to use."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cluster_jobs import expected_frames
from cluster_jobs import frames as cluster_frames
from conftest import HANG_S, jar, project_version

SPARK_HANG_S = 5 * HANG_S  # only catches a hang: a JVM on a loaded machine
MANAGER = "io.nodekernel.spark.NodeKernelShuffleManager"
ROOT = "/spark-shuffle"  # spark.nodekernel.shuffle.root's default
N = 20_000
KEYS = 97

HERE = pathlib.Path(__file__).resolve().parent
# docs/spark.md: the jar of this Spark's line (3.5, Scala 2.12), the client
# (it carries the native library) and, for nk:// paths, the FileSystem.
SPARK_JAR = "nodekernel-spark/spark-3.5_2.12/target/nodekernel-spark-3.5_2.12-VERSION.jar"
CLIENT_JAR = "nodekernel-client/target/nodekernel-client-VERSION.jar"
HADOOP_JAR = "nodekernel-hadoop/target/nodekernel-hadoop-VERSION.jar"
WRONG_SCALA_JAR = "nodekernel-spark/spark-3.5_2.13/target/nodekernel-spark-3.5_2.13-VERSION.jar"


def class_path(*jars: str) -> str:
    return ":".join(jar(j) for j in jars)


def nk_conf(nk) -> dict[str, str]:
    """The settings docs/spark.md gives, for this cluster."""
    jars = class_path(SPARK_JAR, CLIENT_JAR, HADOOP_JAR)
    return {
        "spark.driver.extraClassPath": jars,
        "spark.executor.extraClassPath": jars,
        "spark.shuffle.manager": MANAGER,
        "spark.nodekernel.meta": nk.meta,
        "spark.nodekernel.config": nk.client_config,
        "spark.hadoop.fs.nk.impl": "io.nodekernel.hadoop.NodeKernelFileSystem",
        "spark.hadoop.fs.nk.config": nk.client_config,
    }


def session(conf: dict[str, str]) -> SparkSession:
    b = (
        SparkSession.builder.master("local[2]")
        .appName("nodekernel-pyspark")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        # A shuffle on both sides of the join, not a broadcast of the small one.
        .config("spark.sql.autoBroadcastJoinThreshold", "-1")
    )
    for k, v in conf.items():
        b = b.config(k, v)
    return b.getOrCreate()


def shuffle_manager(spark: SparkSession) -> str:
    return spark._jvm.org.apache.spark.SparkEnv.get().shuffleManager().getClass().getName()


def frames(spark: SparkSession):
    """A groupBy with aggregates, and a join with an aggregation after it."""
    facts, names = cluster_frames(spark, N, KEYS, 4)
    grouped = facts.groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("total"), F.max("v").alias("top")
    )
    joined = (
        facts.join(names, "k")
        .groupBy("k", "name")
        .agg(F.sum("v").alias("total"), F.sum(F.col("flag").cast("int")).alias("flags"))
    )
    return grouped, joined


def rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def expected() -> dict[str, list[tuple]]:
    """The jobs' results, computed without Spark."""
    grouped, joined = expected_frames(N, KEYS)
    return {
        "grouped": sorted((k, *t) for k, t in grouped.items()),
        "joined": sorted((k, f"name{k}", *t) for k, t in joined.items()),
    }


def local_shuffle_files(local_dir: pathlib.Path) -> list[str]:
    """Spark's own shuffle files (shuffle_<s>_<m>_0.data, .index) under spark.local.dir."""
    return sorted(p.name for p in local_dir.rglob("shuffle_*") if p.is_file())


def ls(nk, path: str) -> list[dict]:
    return json.loads(nk.run("ls", path, "--json").stdout)


def test_dataframe_jobs_shuffle_through_nodekernel_and_parquet_on_nk(nk, tmp_path):
    want = expected()
    nk_local = tmp_path / "local-nk"
    default_local = tmp_path / "local-default"

    # As docs/spark.md's recipe: the first session starts the JVM with the
    # jars on its class path.
    spark = session({**nk_conf(nk), "spark.local.dir": str(nk_local)})
    try:
        assert shuffle_manager(spark) == MANAGER
        app_dir = f"{ROOT}/{spark.sparkContext.applicationId}"
        grouped, joined = frames(spark)
        got = {"grouped": rows(grouped), "joined": rows(joined)}
        assert got == want

        # The shuffles went to NodeKernel: a directory per shuffle, each
        # with the map indexes of its map tasks, and bytes under them.
        shuffles = [e["name"] for e in ls(nk, app_dir)]
        assert len(shuffles) >= 3, shuffles  # the groupBy's, the join's two sides
        for s in shuffles:
            assert s.startswith("s"), shuffles
            assert ls(nk, f"{app_dir}/{s}/idx"), f"no map index in {app_dir}/{s}"
        [du] = json.loads(nk.run("du", "-s", "--json", app_dir).stdout)
        assert du["bytes"] > 0 and du["nodes"] > 0, du
        assert local_shuffle_files(nk_local) == []

        # Parquet on nk://, through the Hadoop FileSystem.
        out = f"nk://{nk.meta}/pyspark/joined.parquet"
        joined.write.mode("overwrite").parquet(out)
        assert nk.exists("/pyspark/joined.parquet/_SUCCESS")
        parts = [e["name"] for e in ls(nk, "/pyspark/joined.parquet")]
        assert any(p.startswith("part-") and p.endswith(".parquet") for p in parts), parts
        assert rows(spark.read.parquet(out)) == want["joined"]
    finally:
        spark.stop()
    assert not nk.exists(app_dir), f"{app_dir} left after stop()"
    assert nk.exists("/pyspark/joined.parquet/_SUCCESS")  # the job's output stays

    # Spark's default shuffle, in the same JVM: the same results, and this
    # time Spark's shuffle files on the local disk (what the check above
    # would have found had the NodeKernel manager fallen back to it).
    spark = session(
        {
            **nk_conf(nk),
            "spark.shuffle.manager": "sort",
            "spark.local.dir": str(default_local),
        }
    )
    try:
        assert shuffle_manager(spark) == "org.apache.spark.shuffle.sort.SortShuffleManager"
        grouped, joined = frames(spark)
        assert {"grouped": rows(grouped), "joined": rows(joined)} == got
        assert local_shuffle_files(default_local) != []
        assert rows(spark.read.parquet(f"nk://{nk.meta}/pyspark/joined.parquet")) == got["joined"]
    finally:
        spark.stop()


def submit(nk, jars: str, tmp_path) -> subprocess.CompletedProcess:
    """pyspark_job.py in a fresh interpreter (so a fresh JVM), configured
    only through PYSPARK_SUBMIT_ARGS, as docs/spark.md's second recipe."""
    args = [
        f"--driver-class-path {jars}",
        f"--conf spark.executor.extraClassPath={jars}",
        f"--conf spark.shuffle.manager={MANAGER}",
        f"--conf spark.nodekernel.meta={nk.meta}",
        f"--conf spark.nodekernel.config={nk.client_config}",
        f"--conf spark.local.dir={tmp_path}",
        "--conf spark.driver.host=127.0.0.1",
        "--conf spark.driver.bindAddress=127.0.0.1",
        "--conf spark.ui.enabled=false",
        "pyspark-shell",
    ]
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": " ".join(args)}
    return subprocess.run(
        [sys.executable, str(HERE / "pyspark_job.py"), nk.cluster.bin, nk.meta, nk.client_config],
        env=env,
        capture_output=True,
        text=True,
        timeout=SPARK_HANG_S,
    )


def test_pyspark_submit_args(nk, tmp_path):
    r = submit(nk, class_path(SPARK_JAR, CLIENT_JAR), tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["manager"] == MANAGER
    assert out["counts"] == [[k, 1000] for k in range(10)]
    assert out["shuffle_dirs"] >= 1  # seen in NodeKernel while the session ran
    assert not nk.exists(f"{ROOT}/{out['app']}")


def test_the_scala_213_jar_names_the_212_one(nk, tmp_path):
    r = submit(nk, class_path(WRONG_SCALA_JAR, CLIENT_JAR), tmp_path)
    assert r.returncode != 0, r.stdout
    v = project_version()
    want = (
        f"nodekernel-spark-3.5_2.13-{v}.jar is built for Spark 3.5 on Scala 2.13, but this is "
        f"Spark 3.5.3 on Scala 2.12"
    )
    assert want in r.stderr, r.stderr[-4000:]
    assert f"use nodekernel-spark-3.5_2.12-{v}.jar instead" in r.stderr, r.stderr[-4000:]
    assert "NoClassDefFoundError" not in r.stderr, r.stderr[-4000:]

"""NodeKernel's jars as Maven artifacts, taken by Spark's `--packages`
(`spark.jars.packages`) from the local Maven repository that `scripts/java.sh
--install` (`mvn install`) fills, as docs/spark.md's "Maven coordinates" tells
a user: Spark's Ivy finds `io.nodekernel:nodekernel-hadoop:VERSION` and, through
its POM, the client in `local-m2-cache` (~/.m2/repository), and nothing of
Hadoop or Spark (`provided`). Its Ivy cache is a temporary `spark.jars.ivy`.

Run by the `python` of either wheel's venv: pyspark 3.5 (.venv-pyspark, Scala
2.12: nodekernel-spark-3.5_2.12) or 4.0 (.venv-pyspark-4.0: 4.0_2.13). The jobs
go through the wheel's own `spark-submit` with `--master local-cluster[1,2,1024]`:
a standalone master and worker inside the driver's JVM and an executor in a JVM
of its own that the worker starts, as a cluster's worker starts one, so the
executor's class path is a cluster executor's (in local mode the executor is the
driver, and Spark 3.5 finds a shuffle manager from `--packages` there, but not on
a cluster's executors).

- nk:// through `--packages nodekernel-hadoop` alone (every line): a Parquet table
  written and read back on nk:// equals the frame written; `fs.nk.impl` is needed
  (Hadoop's service loader does not see `--packages` jars).
- The shuffle manager: on 4.0, `--packages` alone (SPARK-45762: executors add the
  application's jars before they create the shuffle manager); on 3.5, `--packages`
  and `spark.executor.extraClassPath` naming the jars it resolved (in
  `spark.jars.ivy`'s `jars/`), without which every executor fails at start
  (ClassNotFoundException) and is started again without end. The DataFrame jobs
  give the results computed without Spark, their shuffles are in NodeKernel while
  the application runs, and gone after it.

Skipped, saying so, when the artifacts are not installed; an installed POM that
differs from the tree's fails (install again).

The file is also the job, run by `spark-submit` (`main` below)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pwd
import subprocess
import sys

import pyspark
import pytest
from pyspark.sql import SparkSession
from test_pyspark import MANAGER, ROOT, SPARK_HANG_S, expected, frames, rows

from conftest import JAVA, project_version

HERE = pathlib.Path(__file__).resolve()
VERSION = project_version()
GROUP = "io.nodekernel"
# The Spark line of this venv's wheel (docs/spark.md, "Which jar goes with which Spark").
SPARK_LINE = {"3.5": "3.5_2.12", "4.0": "4.0_2.13"}.get(
    ".".join(pyspark.__version__.split(".")[:2])
)
HADOOP = f"nodekernel-hadoop-{VERSION}"
CLIENT = f"nodekernel-client-{VERSION}"
SPARK = f"nodekernel-spark-{SPARK_LINE}-{VERSION}"
# Spark's `local-m2-cache`: the local Maven repository under the JVM's user.home
# (the account's home directory, as Maven's default ~/.m2/repository).
M2 = pathlib.Path(pwd.getpwuid(os.getuid()).pw_dir) / ".m2" / "repository"
# The POMs in the tree of each installed artifact that --packages reads: the
# artifacts' own and their parents'.
POMS = {
    "nodekernel-parent": JAVA / "pom.xml",
    "nodekernel-client": JAVA / "nodekernel-client" / "pom.xml",
    "nodekernel-hadoop": JAVA / "nodekernel-hadoop" / "pom.xml",
    "nodekernel-spark-parent": JAVA / "nodekernel-spark" / "pom.xml",
    f"nodekernel-spark-{SPARK_LINE}": JAVA / "nodekernel-spark" / f"spark-{SPARK_LINE}" / "pom.xml",
}


def coordinates(artifact: str) -> str:
    return f"{GROUP}:{artifact}:{VERSION}"


def installed(artifact: str, ext: str) -> pathlib.Path:
    return M2 / GROUP.replace(".", "/") / artifact / VERSION / f"{artifact}-{VERSION}.{ext}"


@pytest.fixture(scope="module")
def artifacts():
    """The installed artifacts: skips when they are not there; fails when an
    installed POM is not the tree's (an install from another tree or an older
    commit)."""
    if SPARK_LINE is None:
        pytest.skip(f"no NodeKernel artifact for pyspark {pyspark.__version__} (3.5 or 4.0)")
    missing = [
        str(p)
        for a in POMS
        for p in [installed(a, "pom")] + ([] if a.endswith("-parent") else [installed(a, "jar")])
        if not p.is_file()
    ]
    if missing:
        pytest.skip(
            f"NodeKernel's artifacts are not installed in {M2} ({len(missing)} files missing, "
            f"{missing[0]} the first): run scripts/java.sh --install first"
        )
    stale = [a for a, pom in POMS.items() if installed(a, "pom").read_text() != pom.read_text()]
    assert not stale, (
        f"the POMs installed in {M2} of {', '.join(stale)} are not the tree's: "
        "run scripts/java.sh --install again"
    )


@pytest.fixture(scope="module")
def spark_home(tmp_path_factory) -> pathlib.Path:
    """The wheel's SPARK_HOME, linked entry by entry into a folder of the
    test's own: the local-cluster worker keeps its executors' folders in
    SPARK_HOME/work, which is then not in the venv."""
    wheel = pathlib.Path(pyspark.__file__).resolve().parent
    home = tmp_path_factory.mktemp("spark-home")
    for entry in wheel.iterdir():
        if entry.name != "work":  # one an earlier run left
            (home / entry.name).symlink_to(entry)
    return home


def submit(nk, spark_home, tmp_path, packages: list[str], conf: dict[str, str], shuffle: bool):
    """This file as a job, through the wheel's spark-submit with --packages
    and a fresh Ivy cache (tmp_path/ivy); its result as JSON, and the
    spark-submit run."""
    out = tmp_path / "result.json"
    args = [
        str(spark_home / "bin" / "spark-submit"),
        "--master",
        "local-cluster[1,2,1024]",
        "--packages",
        ",".join(coordinates(p) for p in packages),
        "--conf",
        f"spark.jars.ivy={tmp_path / 'ivy'}",
        "--conf",
        "spark.hadoop.fs.nk.impl=io.nodekernel.hadoop.NodeKernelFileSystem",
        "--conf",
        f"spark.hadoop.fs.nk.config={nk.client_config}",
        "--conf",
        f"spark.nodekernel.meta={nk.meta}",
        "--conf",
        f"spark.nodekernel.config={nk.client_config}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        "--conf",
        "spark.sql.autoBroadcastJoinThreshold=-1",
    ]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    args += [str(HERE), str(out), nk.cluster.bin, nk.meta, nk.client_config]
    if shuffle:
        args.append("--shuffle")
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "PYSPARK_PYTHON": sys.executable,
        # The driver, the master, the worker and the executor on the loopback.
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    r = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=SPARK_HANG_S, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-6000:]
    return json.loads(out.read_text()), r


def want() -> dict[str, list[list]]:
    """test_pyspark's expected results, as the job's JSON has them."""
    return {k: [list(t) for t in v] for k, v in expected().items()}


def check_resolved(r, tmp_path, artifacts: list[str]) -> None:
    """Ivy found each artifact in the local Maven repository, and took nothing
    else: the provided Spark and Hadoop stay out."""
    for a in artifacts:
        assert f"found {GROUP}#{a};{VERSION} in local-m2-cache" in r.stderr, r.stderr[-6000:]
    jars = sorted(p.name for p in (tmp_path / "ivy" / "jars").iterdir())
    assert jars == sorted(f"{GROUP}_{a}-{VERSION}.jar" for a in artifacts)


def check_parquet(nk, res) -> None:
    assert res["parquet"] == want()["joined"]
    parts = [e["name"] for e in json.loads(nk.run("ls", "--json", res["table"]).stdout)]
    assert "_SUCCESS" in parts, parts
    assert any(p.startswith("part-") and p.endswith(".parquet") for p in parts), parts


def test_hadoop_filesystem_from_packages(nk, artifacts, spark_home, tmp_path):
    res, r = submit(nk, spark_home, tmp_path, ["nodekernel-hadoop"], {}, shuffle=False)
    check_resolved(r, tmp_path, ["nodekernel-hadoop", "nodekernel-client"])
    assert res["executors"] == 1, res
    assert res["manager"] == "org.apache.spark.shuffle.sort.SortShuffleManager"
    assert {"grouped": res["grouped"], "joined": res["joined"]} == want()
    check_parquet(nk, res)


def test_shuffle_manager_from_packages(nk, artifacts, spark_home, tmp_path):
    conf = {"spark.shuffle.manager": MANAGER}
    if SPARK_LINE.startswith("3.5"):
        # Spark 3.5's executors create the shuffle manager before they add the
        # application's jars: the jars --packages resolved, named on their class
        # path (there before the executors start; on a cluster, at that path on
        # every worker host).
        ivy_jars = tmp_path / "ivy" / "jars"
        conf["spark.executor.extraClassPath"] = ":".join(
            str(ivy_jars / f"{GROUP}_{j}.jar") for j in (SPARK, CLIENT, HADOOP)
        )
    packages = [f"nodekernel-spark-{SPARK_LINE}", "nodekernel-hadoop"]
    res, r = submit(nk, spark_home, tmp_path, packages, conf, shuffle=True)
    check_resolved(r, tmp_path, [*packages, "nodekernel-client"])
    assert res["executors"] == 1, res
    assert res["manager"] == MANAGER
    assert {"grouped": res["grouped"], "joined": res["joined"]} == want()
    check_parquet(nk, res)
    # The map outputs (written in the executor's JVM) were in NodeKernel: a
    # directory per shuffle with a map index per map task, gone after stop().
    shuffles = res["shuffles"]
    assert len(shuffles) >= 3, shuffles  # the groupBy's, the join's two sides
    assert all(n > 0 for n in shuffles.values()), shuffles
    assert not nk.exists(f"{ROOT}/{res['app']}")


def nk_ls(nk_bin: str, meta: str, config: str, path: str) -> list[dict]:
    r = subprocess.run(
        [nk_bin, "ls", "--json", path, "--meta", meta, "--config", config],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,  # only catches a hang
    )
    return json.loads(r.stdout)


def main() -> None:
    """The job: test_pyspark's DataFrame jobs, the join's result written to
    and read from nk:// as Parquet, and with --shuffle each shuffle's map
    indexes in NodeKernel, listed while the application runs."""
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("nk_bin")
    p.add_argument("meta")
    p.add_argument("config")
    p.add_argument("--shuffle", action="store_true")
    a = p.parse_args()
    spark = SparkSession.builder.appName("nodekernel-packages").getOrCreate()
    try:
        sc = spark.sparkContext
        app = sc.applicationId
        grouped, joined = frames(spark)
        table = f"/packages/{app}/joined.parquet"
        joined.write.parquet(f"nk://{a.meta}{table}")
        res = {
            "app": app,
            "manager": sc._jvm.org.apache.spark.SparkEnv.get()
            .shuffleManager()
            .getClass()
            .getName(),
            # The driver is listed too.
            "executors": len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1,
            "grouped": rows(grouped),
            "joined": rows(joined),
            "table": table,
            "parquet": rows(spark.read.parquet(f"nk://{a.meta}{table}")),
        }
        if a.shuffle:
            app_dir = f"{ROOT}/{app}"
            res["shuffles"] = {
                s["name"]: len(nk_ls(a.nk_bin, a.meta, a.config, f"{app_dir}/{s['name']}/idx"))
                for s in nk_ls(a.nk_bin, a.meta, a.config, app_dir)
            }
    finally:
        spark.stop()
    pathlib.Path(a.out).write_text(json.dumps(res))


if __name__ == "__main__":
    main()

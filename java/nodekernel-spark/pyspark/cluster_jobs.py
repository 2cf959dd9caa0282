"""The driver of test_cluster.py: submitted with `spark-submit --master
spark://...` to the netns Spark standalone cluster. Runs each job under a
job group of its name (the test finds its tasks in the event log by it)
and writes, as JSON to OUT, the shuffle manager's class, the application
id, the hosts of the driver and executors, each job's result, the final
plans of the AQE jobs and the Scala and Spark versions of the driver and
the executors.

    spark-submit ... cluster_jobs.py OUT EXECUTORS [--nk NK_BIN]
        [--executor-loss DIR | --store-loss DIR | --driver-loss DIR | --host-cut DIR]

EXECUTORS: how many executors to wait for before the first job, so that
tasks spread over the hosts. --nk: with NodeKernel's shuffle, `nk ls` of
the application's directory while the session runs (with the NK_CONFIG
the driver runs with) counts the shuffles kept there. --executor-loss: the
executor-loss jobs instead, two groupByKeys for the test to kill an executor
in: in the first each map task, in the second each reduce task once it has
read its input, leaves a file `<map|reduce>-<partition>-<executor JVM's
pid>` in DIR and takes a few seconds more (the second's map tasks leave
`shuffled-...`, without waiting). --store-loss, --driver-loss, --host-cut:
the jobs the test kills a storage server or the driver in, or cuts a host
off in (store_loss, driver_loss, host_cut)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

HANG_S = 600  # only catches a hang: executors start slowly on a loaded machine
N = 6_000
KEYS = 53
PARTS = 4


def wait_for_executors(sc, n: int) -> list[str]:
    """The hosts of the driver and the executors, once `n` executors have
    registered."""
    deadline = time.monotonic() + HANG_S
    while True:
        # The driver is listed too, with its own host.
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        if len(infos) >= n + 1:
            return sorted(infos[i].host() for i in range(len(infos)))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(infos) - 1} of {n} executors registered")
        time.sleep(0.5)


def jvm_versions(spark, executors: int) -> dict:
    """The Scala and Spark versions of the driver's JVM, and of each
    executor's from a SQL expression its tasks evaluate (`reflect`), with
    the executor's host (SPARK_LOCAL_IP, which a worker's executors
    inherit): [host, Scala, Spark] rows. One task per executor at least, in
    the first wave."""
    jvm = spark.sparkContext._jvm
    probe = spark.range(0, 4 * executors, numPartitions=4 * executors).selectExpr(
        "reflect('java.lang.System', 'getenv', 'SPARK_LOCAL_IP')",
        "reflect('scala.util.Properties', 'versionNumberString')",
        "reflect('org.apache.spark.package', 'SPARK_VERSION')",
    )
    return {
        "driver": [jvm.scala.util.Properties.versionNumberString(), spark.version],
        "executors": sorted({tuple(r) for r in probe.collect()}),
    }


def rdd_jobs(sc) -> dict:
    pairs = sc.parallelize(range(N), PARTS).map(lambda i: (i % KEYS, i))
    out = {}
    sc.setJobGroup("groupByKey", "groupByKey")
    out["groupByKey"] = sorted(
        [k, sorted(vs)] for k, vs in pairs.groupByKey(PARTS).mapValues(list).collect()
    )
    sc.setJobGroup("reduceByKey", "reduceByKey")
    out["reduceByKey"] = sorted(
        [k, v] for k, v in pairs.reduceByKey(lambda a, b: a + b, PARTS).collect()
    )
    # Distinct keys (7919 is invertible mod the prime 10007), so the order
    # of the whole result is defined.
    sc.setJobGroup("sortByKey", "sortByKey")
    keyed = sc.parallelize(range(N), PARTS).map(lambda i: ((i * 7919) % 10_007, i))
    out["sortByKey"] = [list(t) for t in keyed.sortByKey(numPartitions=PARTS).collect()]
    sc.setJobGroup("repartition", "repartition")
    parts = sc.parallelize(range(N), PARTS).repartition(PARTS - 1).glom().collect()
    out["repartition"] = {"partitions": len(parts), "values": sorted(v for p in parts for v in p)}
    return out


def expected_frames(n: int, keys: int) -> tuple[dict[int, tuple], dict[int, tuple]]:
    """What `frames`' facts give, computed without Spark: per key, (count,
    sum, max) of its values, and for the keys `names` has (the even ones),
    (sum of values, count of flagged ones)."""
    grouped: dict[int, tuple] = {}
    joined: dict[int, tuple] = {}
    for v in range(n):
        k = v % keys
        count, total, top = grouped.get(k, (0, 0, -1))
        grouped[k] = (count + 1, total + v, max(top, v))
        if k % 2 == 0:
            total, flags = joined.get(k, (0, 0))
            joined[k] = (total + v, flags + (v % 7 == 0))
    return grouped, joined


def frames(spark, n: int, keys: int, parts: int):
    facts = spark.range(0, n, numPartitions=parts).select(
        (F.col("id") % keys).alias("k"),
        F.col("id").alias("v"),
        (F.col("id") % 7 == 0).alias("flag"),
    )
    names = (
        spark.range(0, keys, numPartitions=2)
        .where(F.col("id") % 2 == 0)
        .select(
            F.col("id").alias("k"),
            F.concat(F.lit("name"), F.col("id").cast("string")).alias("name"),
        )
    )
    return facts, names


def rows(df) -> list[list]:
    return sorted(list(r) for r in df.collect())


def sql_jobs(spark) -> tuple[dict, dict]:
    sc = spark.sparkContext
    out, plans = {}, {}
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTS))
    # Shuffles on both sides of the joins, not a broadcast of the small one.
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    # AQE would coalesce these small partitions into one reduce task; the
    # test wants reducers on several hosts (the job at the defaults below
    # keeps coalescing).
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    facts, names = frames(spark, N, KEYS, PARTS)

    sc.setJobGroup("dataframe", "dataframe")
    out["dataframe"] = rows(
        facts.groupBy("k").agg(
            F.count("*").alias("n"), F.sum("v").alias("total"), F.max("v").alias("top")
        )
    )

    sc.setJobGroup("sqlJoin", "sqlJoin")
    facts.createOrReplaceTempView("facts")
    names.createOrReplaceTempView("names")
    out["sqlJoin"] = rows(
        spark.sql(
            "SELECT f.k, n.name, SUM(f.v) AS total, SUM(CAST(f.flag AS INT)) AS flags "
            "FROM facts f JOIN names n ON f.k = n.k GROUP BY f.k, n.name"
        )
    )

    # Half the rows on key 0: AQE splits that partition of the join into
    # map-index ranges (the settings of ShuffleVariantsTest's skew join).
    sc.setJobGroup("skewJoin", "skewJoin")
    skew = {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.skewJoin.enabled": "true",
        "spark.sql.adaptive.skewJoin.skewedPartitionFactor": "1",
        "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "1k",
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "1k",
    }
    for k, v in skew.items():
        spark.conf.set(k, v)
    left = (
        spark.range(0, N, numPartitions=PARTS)
        .select(
            F.when(F.col("id") % 2 == 0, F.lit(0)).otherwise(F.col("id") % 40).alias("k"),
            F.col("id").alias("v"),
        )
        .repartition(PARTS)
    )
    right = spark.range(0, 40, numPartitions=2).select(
        F.col("id").alias("k"), F.concat(F.lit("name"), F.col("id").cast("string")).alias("name")
    )
    joined = left.join(right, "k")
    # The sums are taken here, not by Spark: an aggregation by k after the
    # join would need the join's partitioning, and AQE does not split a
    # skewed partition where that costs a shuffle.
    sums: dict[int, int] = {}
    for k, v, name in joined.collect():
        assert name == f"name{k}", (k, v, name)
        sums[k] = sums.get(k, 0) + v
    out["skewJoin"] = sorted([k, s] for k, s in sums.items())
    plans["skewJoin"] = joined._jdf.queryExecution().executedPlan().toString()
    for k in skew:
        spark.conf.unset(k)
    spark.conf.unset("spark.sql.adaptive.coalescePartitions.enabled")

    # At Spark's defaults: spark.sql.shuffle.partitions (200) and AQE as
    # Spark 3.5 sets it; larger, so every one of the 200 partitions of each
    # shuffle gets bytes.
    spark.conf.unset("spark.sql.shuffle.partitions")
    sc.setJobGroup("defaults", "defaults")
    big_facts, big_names = frames(spark, 60_000, 1_000, PARTS)
    by_name = (
        big_facts.join(big_names, "k")
        .groupBy((F.col("v") % 10).alias("digit"))
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    )
    out["defaults"] = rows(by_name)
    plans["defaults"] = by_name._jdf.queryExecution().executedPlan().toString()
    return out, plans


def executor_pid() -> int:
    """The pid of the executor JVM this Python worker serves: the parent
    of its parent (pyspark.daemon, which the executor started)."""
    with open(f"/proc/{os.getppid()}/stat") as f:
        # The field after the parenthesised command name is the state, then the ppid.
        return int(f.read().rsplit(")", 1)[1].split()[1])


def executor_loss(sc, markers: str, executors: int) -> dict:
    def mark(kind: str, index: int) -> None:
        open(os.path.join(markers, f"{kind}-{index}-{executor_pid()}"), "w").close()

    def slow_map(index, it):
        mark("map", index)
        time.sleep(3)
        return it

    def slow_reduce(index, it):
        sums = [[k, sum(vs)] for k, vs in it]  # the whole shuffle input read
        mark("reduce", index)
        time.sleep(5)
        return iter(sums)

    out = {}
    # Nine map tasks on three one-core executors: three waves, so an
    # executor killed in its second map task has finished one already.
    sc.setJobGroup("executorLostInMap", "executorLostInMap")
    pairs = sc.parallelize(range(N), 9).mapPartitionsWithIndex(slow_map)
    out["executorLostInMap"] = sorted(
        pairs.map(lambda i: (i % KEYS, i)).reduceByKey(lambda a, b: a + b, 4).collect()
    )
    # The worker starts an executor in place of the killed one.
    wait_for_executors(sc, executors)
    sc.setJobGroup("executorLostInReduce", "executorLostInReduce")

    def marked_map(index, it):
        # Says which executors hold map output of this job (no wait): the
        # executor that replaced the killed one may have started too late
        # for any.
        mark("shuffled", index)
        return it

    pairs = sc.parallelize(range(N), 6).mapPartitionsWithIndex(marked_map)
    pairs = pairs.map(lambda i: (i % KEYS, i))
    out["executorLostInReduce"] = sorted(
        pairs.groupByKey(9).mapPartitionsWithIndex(slow_reduce).collect()
    )
    return out


def wait_file(path: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path}")
        time.sleep(0.2)


def store_loss(sc, markers: str, group: str = "storeLost") -> dict:
    """One shuffle read by two jobs: the first runs its map and reduce
    stages, then (after `mapped` in DIR) the test kills a storage server (or
    cuts a host off) and leaves `go`; the second job's reduce stage reads the
    kept map outputs, some of them lost with the server. Job group `group`."""

    def marked_map(index, it):
        open(os.path.join(markers, f"shuffled-{index}-{executor_pid()}"), "w").close()
        return it

    sc.setJobGroup(group, group)
    pairs = sc.parallelize(range(N), 6).mapPartitionsWithIndex(marked_map)
    summed = pairs.map(lambda i: (i % KEYS, i)).reduceByKey(lambda a, b: a + b, 4)
    before = sorted(summed.collect())
    open(os.path.join(markers, "mapped"), "w").close()
    wait_file(os.path.join(markers, "go"))
    after = sorted(summed.collect())
    # What the map output tracker lists for the shuffle now (a diagnostic the
    # test prints when the result is wrong).
    tracker = sc._jvm.org.apache.spark.SparkEnv.get().mapOutputTracker()
    it = tracker.getMapSizesByExecutorId(0, 0, 2_147_483_647, 0, 4)
    listed = []
    while it.hasNext():
        listed.append(it.next().toString())
    return {f"{group}Before": before, group: after, f"{group}Outputs": listed}


def host_cut(sc, markers: str) -> dict:
    """store_loss's two jobs, the test cutting a host off between them; then
    `read` in DIR, and after `mended` (the host back) a job of a new
    shuffle (job group hostBack)."""
    results = store_loss(sc, markers, "hostCut")
    open(os.path.join(markers, "read"), "w").close()
    wait_file(os.path.join(markers, "mended"))
    sc.setJobGroup("hostBack", "hostBack")
    pairs = sc.parallelize(range(N), 6).map(lambda i: (i % KEYS, i))
    results["hostBack"] = sorted(pairs.reduceByKey(lambda a, b: a + b, 4).collect())
    return results


def driver_loss(sc, markers: str) -> dict:
    """A groupByKey of 9 slow map tasks (each leaves `map-<partition>-<pid>`
    in DIR and takes 3 s): the test kills the driver in it."""

    def slow_map(index, it):
        open(os.path.join(markers, f"map-{index}-{executor_pid()}"), "w").close()
        time.sleep(3)
        return it

    sc.setJobGroup("driverLost", "driverLost")
    pairs = sc.parallelize(range(N), 9).mapPartitionsWithIndex(slow_map)
    return {"driverLost": sorted(pairs.map(lambda i: (i % KEYS, i)).groupByKey(4).keys().collect())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("executors", type=int)
    ap.add_argument("--nk")
    ap.add_argument("--executor-loss")
    ap.add_argument("--store-loss")
    ap.add_argument("--driver-loss")
    ap.add_argument("--host-cut")
    args = ap.parse_args()
    spark = SparkSession.builder.appName("nodekernel-cluster").getOrCreate()
    sc = spark.sparkContext
    plans, versions = {}, None
    try:
        hosts = wait_for_executors(sc, args.executors)
        if args.executor_loss:
            results = executor_loss(sc, args.executor_loss, args.executors)
        elif args.store_loss:
            results = store_loss(sc, args.store_loss)
        elif args.driver_loss:
            results = driver_loss(sc, args.driver_loss)
        elif args.host_cut:
            results = host_cut(sc, args.host_cut)
        else:
            # First, outside the jobs' groups.
            versions = jvm_versions(spark, args.executors)
            results = rdd_jobs(sc)
            sql, plans = sql_jobs(spark)
            results.update(sql)
        app = sc.applicationId
        manager = sc._jvm.org.apache.spark.SparkEnv.get().shuffleManager().getClass().getName()
        shuffle_dirs = None
        if args.nk:
            listed = subprocess.run(
                [args.nk, "ls", "--json", f"/spark-shuffle/{app}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=HANG_S,
            )
            shuffle_dirs = len(json.loads(listed.stdout))
    finally:
        spark.stop()
    with open(args.out, "w") as f:
        json.dump(
            {
                "app": app,
                "manager": manager,
                "executor_hosts": hosts,
                "shuffle_dirs": shuffle_dirs,
                "results": results,
                "plans": plans,
                "versions": versions,
            },
            f,
        )


if __name__ == "__main__":
    main()

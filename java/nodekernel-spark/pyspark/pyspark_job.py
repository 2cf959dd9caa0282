"""A PySpark job configured only by PYSPARK_SUBMIT_ARGS (test_pyspark.py):
a groupBy count; prints, as JSON on its last line, the shuffle manager's
class, the application id, the counts and how many shuffle directories the
application had in NodeKernel while it ran (listed with `nk ls`).

    python pyspark_job.py NK_BIN META CLIENT_CONFIG"""

from __future__ import annotations

import json
import subprocess
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

nk_bin, meta, config = sys.argv[1:]
spark = SparkSession.builder.master("local[2]").appName("nodekernel-pyspark-submit").getOrCreate()
try:
    counts = (
        spark.range(0, 10_000, numPartitions=4)
        .groupBy((F.col("id") % 10).alias("k"))
        .count()
        .collect()
    )
    app = spark.sparkContext.applicationId
    listed = subprocess.run(
        [nk_bin, "ls", "--json", f"/spark-shuffle/{app}", "--meta", meta, "--config", config],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,  # only catches a hang
    )
    manager = spark._jvm.org.apache.spark.SparkEnv.get().shuffleManager().getClass().getName()
    result = {
        "manager": manager,
        "app": app,
        "counts": sorted([r["k"], r["count"]] for r in counts),
        "shuffle_dirs": len(json.loads(listed.stdout)),
    }
finally:
    spark.stop()
print(json.dumps(result))

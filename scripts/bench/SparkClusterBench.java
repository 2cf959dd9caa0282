// The Spark application of scripts/bench-spark-cluster.sh (issue 39, acceptance 4), submitted with
// spark-submit --class to the netns standalone cluster (java/nodekernel-spark/pyspark/
// spark_cluster.py). Compiled together with SparkShuffleBench.java (whose sort and groupBy jobs,
// generation and validation it runs) against the cluster's Spark and NodeKernel's jars.
//
// Arguments (spark_cluster.SparkCluster.submit puts the first two):
//
//   OUT EXECUTORS --jobs sort,group,join,broadcast --manager default|nodekernel
//       --sort-gib G --group-gib G --keys K --partitions P --join-rows N --join-keys K
//       --broadcast-mib M --seed S
//
// Waits until EXECUTORS executors have registered, runs a small warm-up of each job (job group
// "warmup"), then each job of --jobs in its own job group (named as the job), so that the caller
// finds its stages and tasks in the event log. Between jobs the driver runs a GC, so that the
// ContextCleaner deletes the last job's shuffle before the next one starts. Every result is
// validated outside the timed part; a wrong one exits with status 1. Writes to OUT, as JSON, the
// application id, the shuffle manager's class and per job its time and what it measured.
//
// - sort, group: SparkShuffleBench's TeraSort-style sortByKey and groupByKey (RDD API, the
//   serializer spark-submit sets).
// - join: two tables generated with spark.range, a (id, k = id * 7919 mod K, p: 80 hex
//   characters of xxhash64s of id) of N rows and b (k, g = k mod 1000, w = k mod 7) of K rows,
//   then SELECT g, count(*), sum(a.id), sum(a.id * w), sum(xxhash64(p)) FROM a JOIN b USING (k)
//   GROUP BY g (broadcast joins off, so both sides shuffle). Counts and sums are checked against
//   arithmetic here; the sum of hashes is returned for the caller to compare between runs.
// - broadcast: a value of M MiB of random bytes, broadcast with NkBroadcast.create (manager
//   nodekernel) or sc.broadcast (Spark's TorrentBroadcast, manager default), then read by one task
//   on each executor. Each task times its first value() (the read into that JVM) and checks the
//   bytes' checksum; the result has every task's read time and executor.

import io.nodekernel.spark.NkBroadcast;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

public class SparkClusterBench {
  public static void main(String[] args) throws Exception {
    String out = args[0];
    int executors = Integer.parseInt(args[1]);
    Map<String, String> opt = new HashMap<>();
    opt.put("jobs", "sort,group,join,broadcast");
    opt.put("sort-gib", "1");
    opt.put("group-gib", "1");
    opt.put("keys", "100000");
    opt.put("partitions", "24");
    opt.put("join-rows", "8000000");
    opt.put("join-keys", "500000");
    opt.put("broadcast-mib", "100");
    opt.put("seed", "1");
    for (int i = 2; i < args.length; i += 2) {
      if (!args[i].startsWith("--") || i + 1 == args.length) {
        throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
      }
      opt.put(args[i].substring(2), args[i + 1]);
    }
    String manager = SparkShuffleBench.require(opt, "manager");
    int partitions = Integer.parseInt(opt.get("partitions"));
    int keys = Integer.parseInt(opt.get("keys"));
    long seed = Long.parseLong(opt.get("seed"));
    String[] jobs = opt.get("jobs").split(",");

    SparkSession spark = SparkSession.builder().appName("bench-spark-cluster").getOrCreate();
    JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
    StringBuilder json = new StringBuilder("{");
    int status = 0;
    try {
      String actual = SparkEnv.get().shuffleManager().getClass().getName();
      SparkShuffleBench.field(json, "app", quote(sc.sc().applicationId()));
      SparkShuffleBench.field(json, "manager", quote(actual));
      boolean nk = manager.equals("nodekernel");
      if (nk != actual.equals("io.nodekernel.spark.NodeKernelShuffleManager")) {
        throw new IllegalStateException("shuffle manager is " + actual + ", not " + manager + "'s");
      }
      // Every executor registered, so that the tasks spread over the hosts from the first job.
      long deadline = System.nanoTime() + 600_000_000_000L;
      while (sc.sc().getExecutorMemoryStatus().size() < executors + 1) {
        if (System.nanoTime() > deadline) {
          throw new IllegalStateException("fewer than " + executors + " executors registered");
        }
        Thread.sleep(200);
      }

      sc.setJobGroup("warmup", "warm-up", false);
      long t0 = System.nanoTime();
      for (String job : jobs) {
        switch (job) {
          case "sort":
          case "group":
            check(SparkShuffleBench.run(sc, job, 100_000, partitions, keys, seed + 1), job);
            break;
          case "join":
            join(spark, 100_000, 1_000, partitions);
            break;
          case "broadcast":
            broadcast(sc, nk, 1, executors, seed + 1);
            break;
          default:
            throw new IllegalArgumentException("no job " + job);
        }
        sc.setJobGroup("warmup", "warm-up", false);
      }
      sc.clearJobGroup();
      SparkShuffleBench.log("warm-up: %.1f s", SparkShuffleBench.secs(t0));
      cleanUp();

      for (String job : jobs) {
        StringBuilder r = new StringBuilder("{");
        sc.setJobGroup(job, job + " on " + manager, false);
        switch (job) {
          case "sort":
          case "group":
            {
              double gib = Double.parseDouble(opt.get(job + "-gib"));
              long records = SparkShuffleBench.records(gib);
              SparkShuffleBench.Job j =
                  SparkShuffleBench.run(sc, job, records, partitions, keys, seed);
              check(j, job);
              SparkShuffleBench.field(r, "job_ms", j.nanos / 1_000_000);
              SparkShuffleBench.field(r, "gib", gib);
              SparkShuffleBench.field(r, "records", records);
              break;
            }
          case "join":
            {
              long rows = Long.parseLong(opt.get("join-rows"));
              Joined j = join(spark, rows, Long.parseLong(opt.get("join-keys")), partitions);
              SparkShuffleBench.field(r, "job_ms", j.nanos / 1_000_000);
              SparkShuffleBench.field(r, "rows", rows);
              SparkShuffleBench.field(r, "keys", opt.get("join-keys"));
              SparkShuffleBench.field(r, "digest", quote(Long.toHexString(j.digest)));
              break;
            }
          case "broadcast":
            {
              int mib = Integer.parseInt(opt.get("broadcast-mib"));
              r.append(broadcast(sc, nk, mib, executors, seed));
              SparkShuffleBench.field(r, "mib", mib);
              break;
            }
          default:
            throw new IllegalArgumentException("no job " + job);
        }
        sc.clearJobGroup();
        r.setLength(r.length() - 1);
        SparkShuffleBench.field(json, job, r.append('}'));
        SparkShuffleBench.log("%s on %s: %s", job, manager, r);
        cleanUp();
      }
    } catch (SparkShuffleBench.Invalid e) {
      System.err.println("bench-spark-cluster: INVALID RESULT: " + e.getMessage());
      status = 1;
    } finally {
      // Before stop(): the event log is complete once the application has ended.
      json.setLength(json.length() - 1);
      Files.write(Paths.get(out), json.append('}').toString().getBytes(StandardCharsets.UTF_8));
      spark.stop();
    }
    System.exit(status);
  }

  static String quote(String s) {
    return '"' + s + '"';
  }

  static void check(SparkShuffleBench.Job job, String what) throws SparkShuffleBench.Invalid {
    SparkShuffleBench.check(job, what);
  }

  /** Lets the ContextCleaner delete the shuffles (and broadcasts) of the job just run. */
  static void cleanUp() throws InterruptedException {
    for (int i = 0; i < 3; i++) {
      System.gc();
      Thread.sleep(1000);
    }
  }

  // ---- join ----

  static final class Joined {
    final long nanos;
    final long digest;

    Joined(long nanos, long digest) {
      this.nanos = nanos;
      this.digest = digest;
    }
  }

  static final int GROUPS = 1000;

  static Joined join(SparkSession spark, long rows, long keys, int partitions)
      throws SparkShuffleBench.Invalid {
    spark.conf().set("spark.sql.autoBroadcastJoinThreshold", "-1");
    spark.conf().set("spark.sql.shuffle.partitions", String.valueOf(partitions));
    long t0 = System.nanoTime();
    Dataset<Row> a =
        spark
            .range(0, rows, 1, partitions)
            .selectExpr(
                "id",
                "(id * 7919) % " + keys + " AS k",
                "concat(hex(xxhash64(id, 1)), hex(xxhash64(id, 2)), hex(xxhash64(id, 3)),"
                    + " hex(xxhash64(id, 4)), hex(xxhash64(id, 5))) AS p");
    Dataset<Row> b =
        spark
            .range(0, keys, 1, partitions)
            .selectExpr("id AS k", "id % " + GROUPS + " AS g", "id % 7 AS w");
    a.createOrReplaceTempView("bench_a");
    b.createOrReplaceTempView("bench_b");
    List<Row> got =
        spark
            .sql(
                "SELECT g, count(*) AS n, sum(a.id) AS s, sum(a.id * w) AS sw,"
                    + " sum(xxhash64(p)) AS h FROM bench_a a JOIN bench_b b ON a.k = b.k"
                    + " GROUP BY g")
            .collectAsList();
    long nanos = System.nanoTime() - t0;

    // Validation (not timed): every group's count and sums by arithmetic.
    long[] n = new long[GROUPS];
    long[] s = new long[GROUPS];
    long[] sw = new long[GROUPS];
    for (long id = 0; id < rows; id++) {
      long k = (id * 7919) % keys;
      int g = (int) (k % GROUPS);
      n[g]++;
      s[g] += id;
      sw[g] += id * (k % 7);
    }
    int present = 0;
    for (long c : n) {
      present += c > 0 ? 1 : 0;
    }
    if (got.size() != present) {
      throw new SparkShuffleBench.Invalid("join: " + got.size() + " groups, not " + present);
    }
    long digest = 0;
    Set<Long> seen = new HashSet<>();
    for (Row r : got) {
      long g = r.getLong(0);
      if (g < 0 || g >= GROUPS || !seen.add(g)) {
        throw new SparkShuffleBench.Invalid("join: group " + g + " out of range or twice");
      }
      int i = (int) g;
      if (r.getLong(1) != n[i] || r.getLong(2) != s[i] || r.getLong(3) != sw[i]) {
        throw new SparkShuffleBench.Invalid(
            String.format(
                Locale.ROOT,
                "join: group %d: %d rows, sums %d %d; want %d, %d %d",
                g,
                r.getLong(1),
                r.getLong(2),
                r.getLong(3),
                n[i],
                s[i],
                sw[i]));
      }
      digest += SparkShuffleBench.mix(r.getLong(4) * 31 + g);
    }
    return new Joined(nanos, digest);
  }

  // ---- broadcast ----

  /**
   * NkBroadcast behind a class of its own, loaded at its first use: the default shuffle's
   * applications run without NodeKernel's jars on their class path.
   */
  static final class Nk {
    private Nk() {}

    static <T> Broadcast<T> create(JavaSparkContext sc, T value) {
      return NkBroadcast.create(sc, value);
    }
  }

  static long sum(byte[] b) {
    return SparkShuffleBench.hash(b, 17);
  }

  /** The broadcast's JSON fields (each ending in a comma). */
  static String broadcast(JavaSparkContext sc, boolean nk, int mib, int executors, long seed)
      throws SparkShuffleBench.Invalid {
    byte[] value = new byte[mib << 20];
    SparkShuffleBench.fill(new SplittableRandom(seed), value);
    long want = sum(value);
    long t0 = System.nanoTime();
    Broadcast<byte[]> b = nk ? Nk.create(sc, value) : sc.broadcast(value);
    long createNanos = System.nanoTime() - t0;
    List<Integer> tasks = new ArrayList<>();
    for (int i = 0; i < executors; i++) {
      tasks.add(i);
    }
    long t1 = System.nanoTime();
    List<long[]> got =
        sc.parallelize(tasks, executors)
            .map(
                i -> {
                  long r0 = System.nanoTime();
                  byte[] v = b.value();
                  long readNanos = System.nanoTime() - r0;
                  return new long[] {
                    readNanos, sum(v), v.length, Long.parseLong(SparkEnv.get().executorId())
                  };
                })
            .collect();
    long jobNanos = System.nanoTime() - t1;
    b.destroy();
    StringBuilder r = new StringBuilder();
    StringBuilder reads = new StringBuilder("[");
    StringBuilder on = new StringBuilder("[");
    for (long[] g : got) {
      if (g[1] != want || g[2] != value.length) {
        throw new SparkShuffleBench.Invalid(
            "broadcast: executor " + g[3] + " read " + g[2] + " bytes, other bytes than sent");
      }
      reads.append(g[0] / 1_000_000).append(',');
      on.append(g[3]).append(',');
    }
    reads.setLength(reads.length() - 1);
    on.setLength(on.length() - 1);
    SparkShuffleBench.field(r, "create_ms", createNanos / 1_000_000);
    SparkShuffleBench.field(r, "job_ms", jobNanos / 1_000_000);
    SparkShuffleBench.field(r, "read_ms", reads.append(']'));
    SparkShuffleBench.field(r, "executors", on.append(']'));
    return r.toString();
  }
}

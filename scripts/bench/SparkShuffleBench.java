// One timed Spark job on one shuffle manager, for scripts/bench-spark.sh (issue 19, acceptance
// 4): a TeraSort-style sort of generated 100-byte records, or a groupByKey of generated
// (int key, payload) records. Run as a single-file program with nodekernel-spark, its client and
// Spark's jars on the class path:
//
//   java <Spark's --add-opens> -cp CP scripts/bench/SparkShuffleBench.java \
//       --job sort|group --manager default|nodekernel --gib G --partitions P \
//       [--master local[2]] [--meta HOST:PORT] [--local-dir DIR] [--keys 100000]
//       [--warmup-gib 0.01] [--seed 1]
//
// Generates the records inside the tasks (no input files), runs a small warm-up job of the same
// kind in this JVM, then the timed job, validates its result against a regeneration of the input
// (outside the timed part) and prints one line, "RESULT {json}", on stdout. A wrong result exits
// with status 1 and no RESULT line.

import java.io.Serializable;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.SplittableRandom;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.executor.ShuffleReadMetrics;
import org.apache.spark.executor.ShuffleWriteMetrics;
import org.apache.spark.executor.TaskMetrics;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.StageInfo;
import scala.Tuple2;

public class SparkShuffleBench {
  static final int RECORD = 100;
  static final int KEY = 10;
  static final int GROUP_PAYLOAD = RECORD - Integer.BYTES;
  static final String TIMED = "timed";

  public static void main(String[] args) throws Exception {
    Map<String, String> opt = new HashMap<>();
    opt.put("master", "local[2]");
    opt.put("keys", "100000");
    opt.put("warmup-gib", "0.01");
    opt.put("seed", "1");
    for (int i = 0; i < args.length; i += 2) {
      if (!args[i].startsWith("--") || i + 1 == args.length) {
        throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
      }
      opt.put(args[i].substring(2), args[i + 1]);
    }
    String job = require(opt, "job");
    String manager = require(opt, "manager");
    double gib = Double.parseDouble(require(opt, "gib"));
    int partitions = Integer.parseInt(require(opt, "partitions"));
    int keys = Integer.parseInt(opt.get("keys"));
    long seed = Long.parseLong(opt.get("seed"));
    if (!job.equals("sort") && !job.equals("group")) {
      throw new IllegalArgumentException("--job is sort or group, not " + job);
    }

    // The source launcher loads this file's classes in its own class loader; Spark's executor
    // (in this JVM) resolves task classes through the context class loader.
    Thread.currentThread().setContextClassLoader(SparkShuffleBench.class.getClassLoader());
    SparkConf conf =
        new SparkConf()
            .setMaster(opt.get("master"))
            .setAppName("bench-spark-" + job + "-" + manager)
            .set("spark.ui.enabled", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.serializer", "org.apache.spark.serializer.KryoSerializer");
    String expected;
    switch (manager) {
      case "default":
        conf.set("spark.shuffle.manager", "sort");
        expected = "org.apache.spark.shuffle.sort.SortShuffleManager";
        break;
      case "nodekernel":
        expected = "io.nodekernel.spark.NodeKernelShuffleManager";
        conf.set("spark.shuffle.manager", expected);
        if (opt.containsKey("meta")) {
          conf.set("spark.nodekernel.meta", opt.get("meta"));
        }
        break;
      default:
        throw new IllegalArgumentException("--manager is default or nodekernel, not " + manager);
    }
    if (opt.containsKey("local-dir")) {
      conf.set("spark.local.dir", opt.get("local-dir"));
    }

    JavaSparkContext sc = new JavaSparkContext(conf);
    int status = 0;
    try {
      String actual = SparkEnv.get().shuffleManager().getClass().getName();
      if (!actual.equals(expected)) {
        throw new IllegalStateException("shuffle manager is " + actual + ", not " + expected);
      }
      Metrics metrics = new Metrics();
      sc.sc().addSparkListener(metrics);

      double warmGib = Math.min(gib, Double.parseDouble(opt.get("warmup-gib")));
      long t0 = System.nanoTime();
      Job warm = run(sc, job, records(warmGib), partitions, keys, seed + 1);
      log("warm-up %s on %s (%.3f GiB): %.1f s", job, manager, warmGib, secs(t0));
      check(warm, "warm-up");

      long records = records(gib);
      // The listener measures the jobs of this group: the timed part of run (which clears it).
      sc.setJobGroup(TIMED, job + " on " + manager, false);
      Job timed = run(sc, job, records, partitions, keys, seed);
      sc.sc().listenerBus().waitUntilEmpty();
      log("%s on %s (%.3f GiB): %.1f s", job, manager, gib, timed.nanos / 1e9);
      check(timed, "timed job");

      Stats s = metrics.stats();
      StringBuilder json = new StringBuilder("{");
      field(json, "job", '"' + job + '"');
      field(json, "manager", '"' + manager + '"');
      field(json, "gib", String.format(Locale.ROOT, "%.3f", gib));
      field(json, "records", records);
      field(json, "partitions", partitions);
      field(json, "master", '"' + opt.get("master") + '"');
      field(json, "job_ms", timed.nanos / 1_000_000);
      field(json, "map_stage_ms", s.mapMs);
      field(json, "reduce_stage_ms", s.reduceMs);
      field(json, "other_stage_ms", s.otherMs);
      field(json, "shuffle_bytes_written", s.bytesWritten);
      field(json, "shuffle_records_written", s.recordsWritten);
      field(json, "shuffle_write_time_ms", s.writeNanos / 1_000_000);
      field(json, "shuffle_bytes_read", s.bytesRead);
      field(json, "shuffle_fetch_wait_ms", s.fetchWaitMs);
      field(json, "tasks", s.tasks);
      json.setLength(json.length() - 1);
      System.out.println("RESULT " + json.append('}'));
    } catch (Invalid e) {
      System.err.println("bench-spark: INVALID RESULT: " + e.getMessage());
      status = 1;
    } finally {
      sc.stop();
    }
    System.exit(status);
  }

  static String require(Map<String, String> opt, String name) {
    String v = opt.get(name);
    if (v == null) {
      throw new IllegalArgumentException("--" + name + " is required");
    }
    return v;
  }

  static long records(double gib) {
    return Math.max(1, Math.round(gib * (1L << 30) / RECORD));
  }

  static double secs(long t0) {
    return (System.nanoTime() - t0) / 1e9;
  }

  static void log(String format, Object... args) {
    System.err.println("bench-spark: " + String.format(Locale.ROOT, format, args));
  }

  static void field(StringBuilder json, String name, Object value) {
    json.append('"').append(name).append("\":").append(value).append(',');
  }

  /** A job's time and what it found wrong (null: nothing). */
  static final class Job {
    final long nanos;
    final String error;

    Job(long nanos, String error) {
      this.nanos = nanos;
      this.error = error;
    }
  }

  static final class Invalid extends Exception {
    private static final long serialVersionUID = 1L;

    Invalid(String message) {
      super(message);
    }
  }

  static void check(Job job, String what) throws Invalid {
    if (job.error != null) {
      throw new Invalid(what + ": " + job.error);
    }
  }

  static Job run(
      JavaSparkContext sc, String job, long records, int partitions, int keys, long seed) {
    List<Integer> maps = new ArrayList<>();
    for (int m = 0; m < partitions; m++) {
      maps.add(m);
    }
    // One element per map partition: its index, from which the task generates its records.
    JavaRDD<Integer> splits = sc.parallelize(maps, partitions);
    return job.equals("sort")
        ? sort(sc, splits, records, partitions, seed)
        : group(sc, splits, records, partitions, keys, seed);
  }

  // ---- Records and checksums ----

  static final VarHandle LONGS =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

  /** Map partition m's share of n records over p partitions. */
  static long share(long n, int p, int m) {
    return n / p + (m < n % p ? 1 : 0);
  }

  static SplittableRandom random(long seed, int m) {
    return new SplittableRandom(seed * 0x9E3779B97F4A7C15L + m);
  }

  static void fill(SplittableRandom r, byte[] b) {
    int i = 0;
    for (; i + 8 <= b.length; i += 8) {
      LONGS.set(b, i, r.nextLong());
    }
    for (long v = r.nextLong(); i < b.length; i++, v >>>= 8) {
      b[i] = (byte) v;
    }
  }

  static long mix(long z) {
    z = (z ^ (z >>> 33)) * 0xFF51AFD7ED558CCDL;
    z = (z ^ (z >>> 33)) * 0xC4CEB9FE1A85EC53L;
    return z ^ (z >>> 33);
  }

  static long hash(byte[] b, long h) {
    int i = 0;
    for (; i + 8 <= b.length; i += 8) {
      h = Long.rotateLeft(h ^ (long) LONGS.get(b, i) * 0x9E3779B97F4A7C15L, 27) * 31;
    }
    for (; i < b.length; i++) {
      h = (h ^ (b[i] & 0xFF)) * 0x100000001B3L;
    }
    return mix(h ^ b.length);
  }

  /** A record's contribution to the order-independent checksum (a sum). */
  static long sortHash(byte[] key, byte[] value) {
    return hash(value, hash(key, 17));
  }

  static long groupHash(int key, byte[] payload) {
    return hash(payload, mix(key + 0x632BE59BD9B4E019L));
  }

  /** TeraSort-style records of map partition m: 10-byte random key, 90-byte random value. */
  static final class SortRecords implements Iterator<Tuple2<byte[], byte[]>> {
    final SplittableRandom r;
    long left;

    SortRecords(long seed, int m, long n) {
      r = random(seed, m);
      left = n;
    }

    @Override
    public boolean hasNext() {
      return left > 0;
    }

    @Override
    public Tuple2<byte[], byte[]> next() {
      if (left-- <= 0) {
        throw new NoSuchElementException();
      }
      byte[] k = new byte[KEY];
      byte[] v = new byte[RECORD - KEY];
      fill(r, k);
      fill(r, v);
      return new Tuple2<>(k, v);
    }
  }

  /** (key, payload) records of map partition m: a uniform key below `keys`, 96 random bytes. */
  static final class GroupRecords implements Iterator<Tuple2<Integer, byte[]>> {
    final SplittableRandom r;
    final int keys;
    long left;

    GroupRecords(long seed, int m, long n, int keys) {
      r = random(seed, m);
      this.keys = keys;
      left = n;
    }

    @Override
    public boolean hasNext() {
      return left > 0;
    }

    @Override
    public Tuple2<Integer, byte[]> next() {
      if (left-- <= 0) {
        throw new NoSuchElementException();
      }
      int k = r.nextInt(keys);
      byte[] v = new byte[GROUP_PAYLOAD];
      fill(r, v);
      return new Tuple2<>(k, v);
    }
  }

  // ---- Run A: TeraSort style ----

  /** Unsigned lexicographic order of keys, as TeraSort's. */
  static final class Unsigned implements Comparator<byte[]>, Serializable {
    private static final long serialVersionUID = 1L;

    @Override
    public int compare(byte[] a, byte[] b) {
      return Arrays.compareUnsigned(a, b);
    }
  }

  /** What one sorted partition holds: checked on the driver. */
  static final class Summary implements Serializable {
    private static final long serialVersionUID = 1L;
    int partition;
    long count;
    long checksum;
    byte[] first;
    byte[] last;
    long unordered = -1; // index of the first record smaller than its predecessor
  }

  static Job sort(
      JavaSparkContext sc, JavaRDD<Integer> splits, long records, int partitions, long seed) {
    long t0 = System.nanoTime();
    JavaPairRDD<byte[], byte[]> input =
        splits.flatMapToPair(m -> new SortRecords(seed, m, share(records, partitions, m)));
    // sortByKey samples the input (a job of its own, part of the timed time), then shuffles.
    List<Summary> parts =
        input
            .sortByKey(new Unsigned(), true, partitions)
            .mapPartitionsWithIndex(
                (p, it) -> {
                  Summary s = new Summary();
                  s.partition = p;
                  byte[] prev = null;
                  while (it.hasNext()) {
                    Tuple2<byte[], byte[]> t = it.next();
                    byte[] k = t._1();
                    if (prev == null) {
                      s.first = k;
                    } else if (s.unordered < 0 && Arrays.compareUnsigned(prev, k) > 0) {
                      s.unordered = s.count;
                    }
                    s.checksum += sortHash(k, t._2());
                    s.count++;
                    prev = k;
                  }
                  s.last = prev;
                  return List.of(s).iterator();
                },
                false)
            .collect();
    long nanos = System.nanoTime() - t0;
    sc.clearJobGroup();

    // Validation (not timed): the generated checksum from a second generation of the input.
    long want =
        splits
            .map(
                m -> {
                  long sum = 0;
                  SortRecords it = new SortRecords(seed, m, share(records, partitions, m));
                  while (it.hasNext()) {
                    Tuple2<byte[], byte[]> t = it.next();
                    sum += sortHash(t._1(), t._2());
                  }
                  return sum;
                })
            .reduce(Long::sum);
    long count = 0;
    long checksum = 0;
    byte[] prevLast = null;
    int prevPart = -1;
    if (parts.size() != partitions) {
      return new Job(nanos, parts.size() + " sorted partitions, not " + partitions);
    }
    for (Summary s : parts) {
      count += s.count;
      checksum += s.checksum;
      if (s.unordered >= 0) {
        return new Job(nanos, "partition " + s.partition + " unsorted at record " + s.unordered);
      }
      if (s.count == 0) {
        continue;
      }
      if (prevLast != null && Arrays.compareUnsigned(prevLast, s.first) > 0) {
        return new Job(
            nanos, "partition " + prevPart + " ends after partition " + s.partition + " begins");
      }
      prevLast = s.last;
      prevPart = s.partition;
    }
    if (count != records) {
      return new Job(nanos, count + " records sorted, " + records + " generated");
    }
    if (checksum != want) {
      return new Job(nanos, String.format("checksum %016x, generated %016x", checksum, want));
    }
    return new Job(nanos, null);
  }

  // ---- Run B: groupByKey ----

  static Job group(
      JavaSparkContext sc,
      JavaRDD<Integer> splits,
      long records,
      int partitions,
      int keys,
      long seed) {
    long t0 = System.nanoTime();
    List<long[]> groups =
        splits
            .flatMapToPair(m -> new GroupRecords(seed, m, share(records, partitions, m), keys))
            .groupByKey(partitions)
            .map(
                t -> {
                  long n = 0;
                  long sum = 0;
                  for (byte[] v : t._2()) {
                    n++;
                    sum += groupHash(t._1(), v);
                  }
                  return new long[] {t._1(), n, sum};
                })
            .collect();
    long nanos = System.nanoTime() - t0;
    sc.clearJobGroup();

    // Validation (not timed): per-key counts and checksums of a second generation of the input.
    long[] want =
        splits
            .map(
                m -> {
                  long[] a = new long[2 * keys];
                  GroupRecords it = new GroupRecords(seed, m, share(records, partitions, m), keys);
                  while (it.hasNext()) {
                    Tuple2<Integer, byte[]> t = it.next();
                    a[2 * t._1()]++;
                    a[2 * t._1() + 1] += groupHash(t._1(), t._2());
                  }
                  return a;
                })
            .reduce(
                (a, b) -> {
                  for (int i = 0; i < a.length; i++) {
                    a[i] += b[i];
                  }
                  return a;
                });
    int present = 0;
    long total = 0;
    for (int k = 0; k < keys; k++) {
      present += want[2 * k] > 0 ? 1 : 0;
      total += want[2 * k];
    }
    if (total != records) {
      return new Job(nanos, total + " records regenerated, " + records + " expected");
    }
    if (groups.size() != present) {
      return new Job(nanos, groups.size() + " groups, " + present + " keys generated");
    }
    Set<Long> seen = new HashSet<>();
    for (long[] g : groups) {
      int k = (int) g[0];
      if (g[0] < 0 || g[0] >= keys || !seen.add(g[0])) {
        return new Job(nanos, "key " + g[0] + " out of range or in two groups");
      }
      if (g[1] != want[2 * k] || g[2] != want[2 * k + 1]) {
        return new Job(
            nanos,
            String.format(
                "key %d: %d records, checksum %016x; generated %d, %016x",
                k, g[1], g[2], want[2 * k], want[2 * k + 1]));
      }
    }
    return new Job(nanos, null);
  }

  // ---- Metrics of the timed job ----

  static final class Stats {
    long mapMs;
    long reduceMs;
    long otherMs;
    long bytesWritten;
    long recordsWritten;
    long writeNanos;
    long bytesRead;
    long fetchWaitMs;
    long tasks;
  }

  /** Per-stage sums of the task metrics of the jobs in the TIMED job group. */
  static final class Metrics extends SparkListener {
    final Set<Integer> stages = new HashSet<>();
    final Map<Integer, long[]> sums = new HashMap<>(); // written, records, write ns, read, wait
    final Map<Integer, Long> durations = new HashMap<>();

    @Override
    public synchronized void onJobStart(SparkListenerJobStart e) {
      if (e.properties() != null && TIMED.equals(e.properties().getProperty("spark.jobGroup.id"))) {
        // A Scala iterator, not CollectionConverters: this file also compiles against Scala 2.12
        // (scripts/bench/SparkClusterBench.java uses its jobs on the pyspark wheel's Spark).
        scala.collection.Iterator<Object> ids = e.stageIds().iterator();
        while (ids.hasNext()) {
          stages.add((Integer) ids.next());
        }
      }
    }

    @Override
    public synchronized void onTaskEnd(SparkListenerTaskEnd e) {
      TaskMetrics m = e.taskMetrics();
      if (!stages.contains(e.stageId()) || m == null) {
        return;
      }
      ShuffleWriteMetrics w = m.shuffleWriteMetrics();
      ShuffleReadMetrics r = m.shuffleReadMetrics();
      long[] s = sums.computeIfAbsent(e.stageId(), id -> new long[6]);
      s[0] += w.bytesWritten();
      s[1] += w.recordsWritten();
      s[2] += w.writeTime();
      s[3] += r.totalBytesRead();
      s[4] += r.fetchWaitTime();
      s[5]++;
    }

    @Override
    public synchronized void onStageCompleted(SparkListenerStageCompleted e) {
      StageInfo info = e.stageInfo();
      if (stages.contains(info.stageId())
          && info.submissionTime().isDefined()
          && info.completionTime().isDefined()) {
        long ms = (Long) info.completionTime().get() - (Long) info.submissionTime().get();
        durations.merge(info.stageId(), ms, Long::sum);
      }
    }

    synchronized Stats stats() {
      Stats st = new Stats();
      for (Map.Entry<Integer, long[]> e : sums.entrySet()) {
        long[] s = e.getValue();
        long ms = durations.getOrDefault(e.getKey(), 0L);
        // The map stage writes the shuffle, the reduce stage reads it; the sort's sampling
        // stage does neither.
        if (s[0] > 0) {
          st.mapMs += ms;
        } else if (s[3] > 0) {
          st.reduceMs += ms;
        } else {
          st.otherMs += ms;
        }
        st.bytesWritten += s[0];
        st.recordsWritten += s[1];
        st.writeNanos += s[2];
        st.bytesRead += s[3];
        st.fetchWaitMs += s[4];
        st.tasks += s[5];
      }
      return st;
    }
  }
}

package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import io.nodekernel.NodeKernel;
import io.nodekernel.NodeStatus;
import io.nodekernel.TestCluster;
import java.io.IOException;
import java.lang.ref.Reference;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.Dependency;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Test;
import scala.Tuple2;

/**
 * Jobs in local mode ({@code local[2]}, Kryo, so that {@code repartition} and SQL go through {@code
 * UnsafeShuffleWriter} and the aggregations through {@code SortShuffleWriter}) with the NodeKernel
 * shuffle give the results computed here without Spark, and their shuffle data is in NodeKernel.
 */
public class ShuffleJobTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static final int N = 20_000;
  private static JavaSparkContext sc;
  private static List<Tuple2<Integer, Integer>> pairs;

  static SparkConf conf(String master, TestCluster cluster) {
    return new SparkConf()
        .setMaster(master)
        .setAppName("nodekernel-shuffle")
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.shuffle.manager", NodeKernelShuffleManager.class.getName())
        .set(NkShuffleConf.META, cluster.meta())
        .set(NkShuffleConf.CONFIG, cluster.clientConfig());
  }

  @BeforeClass
  public static void start() {
    sc =
        new JavaSparkContext(
            conf("local[2]", CLUSTER.cluster())
                .set("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
                .set("spark.sql.shuffle.partitions", "4")
                .set("spark.sql.autoBroadcastJoinThreshold", "-1"));
    pairs = new ArrayList<>();
    for (int i = 0; i < N; i++) {
      pairs.add(new Tuple2<>(i % 97, i));
    }
  }

  @AfterClass
  public static void stop() {
    if (sc != null) {
      sc.stop();
    }
    SparkSession.clearActiveSession();
    SparkSession.clearDefaultSession();
  }

  private static JavaPairRDD<Integer, Integer> input() {
    return sc.parallelizePairs(pairs, 4);
  }

  /** The shuffle directories of the application. */
  private static Set<String> shuffleDirs() throws IOException {
    String app = NkShuffleConf.DEFAULT_ROOT + "/" + sc.sc().applicationId();
    Set<String> dirs = new TreeSet<>();
    if (!CLUSTER.client().exists(app)) {
      return dirs;
    }
    for (NodeStatus s : CLUSTER.client().list(app)) {
      dirs.add(s.path().startsWith("/") ? s.path() : app + "/" + s.path());
    }
    return dirs;
  }

  /** The bytes of every segment the committed map indexes of shuffle directory {@code dir} list. */
  private static long indexedBytes(String dir) throws IOException {
    NodeKernel nk = CLUSTER.client();
    long total = 0;
    for (NodeStatus s : nk.list(dir + "/idx")) {
      String name = s.path().substring(s.path().lastIndexOf('/') + 1);
      MapIndex index = MapIndex.decode(nk.get(dir + "/idx/" + name));
      for (int i = 0; i < index.segments(); i++) {
        total += index.length(i);
      }
    }
    return total;
  }

  /** Map tasks per writer class so far, in this JVM's NodeKernel shuffle manager. */
  static Map<String, Long> writersUsed() {
    return ((NodeKernelShuffleManager) SparkEnv.get().shuffleManager()).writersUsed();
  }

  /**
   * The task metrics (what the UI shows) count the bytes of the committed segments once when
   * written and once when read, the records alike, and the time spent writing, whichever writer
   * wrote them: {@code SortShuffleWriter} (reduceByKey: map-side combine), {@link NkDirectWriter}
   * (repartition to 5) and {@code UnsafeShuffleWriter} (repartition to more partitions than Spark's
   * bypass threshold, 200, with Kryo).
   */
  @Test
  public void taskMetricsCountTheShuffledBytesAndRecords() throws IOException {
    Map<String, String> writerOf =
        Map.of(
            "reduceByKey", "SortShuffleWriter",
            "repartition5", "NkDirectWriter",
            "repartition250", "UnsafeShuffleWriter");
    for (String job : new String[] {"reduceByKey", "repartition5", "repartition250"}) {
      Set<String> before = shuffleDirs();
      String writer = writerOf.get(job);
      long runBefore = writersUsed().getOrDefault(writer, 0L);
      ShuffleMetrics m = ShuffleMetrics.listen(sc.sc());
      RDD<?> rdd =
          switch (job) {
            case "reduceByKey" -> input().reduceByKey(Integer::sum, 3).rdd();
            case "repartition5" -> input().values().repartition(5).rdd();
            default -> input().values().repartition(250).rdd();
          };
      long count = rdd.count();
      m.close();
      assertEquals(job.equals("reduceByKey") ? 97 : N, count);
      assertEquals(job + " wrote with " + writer, runBefore + 4, (long) writersUsed().get(writer));
      // Its own shuffle's directory (the ContextCleaner may remove earlier ones meanwhile, never
      // this one while the RDD is reachable).
      String dir =
          NkShuffleConf.DEFAULT_ROOT + "/" + sc.sc().applicationId() + "/s" + shuffleId(rdd);
      Set<String> dirs = shuffleDirs();
      dirs.removeAll(before);
      assertEquals(job + " made one shuffle", Set.of(dir), dirs);
      long indexed = indexedBytes(dir);
      assertTrue(job + ": no bytes indexed", indexed > 0);
      assertEquals(job + ": bytes written", indexed, m.bytesWritten);
      assertEquals(job + ": bytes read", indexed, m.bytesRead);
      // One host: the map indexes name this host, so every read counts as local.
      assertEquals(job + ": local bytes read", indexed, m.localBytesRead);
      assertEquals(job + ": records read", m.recordsWritten, m.recordsRead);
      assertTrue(job + ": records written", m.recordsWritten > 0);
      assertTrue(job + ": write time", m.writeTimeNanos > 0);
      assertTrue(job + ": blocks fetched", m.blocksFetched > 0);
      Reference.reachabilityFence(rdd);
    }
  }

  @Test
  public void groupByKey() throws Exception {
    Map<Integer, List<Integer>> expected = new TreeMap<>();
    for (Tuple2<Integer, Integer> p : pairs) {
      expected.computeIfAbsent(p._1(), k -> new ArrayList<>()).add(p._2());
    }
    Map<Integer, List<Integer>> got = new TreeMap<>();
    JavaPairRDD<Integer, Iterable<Integer>> grouped = input().groupByKey(3);
    for (Tuple2<Integer, Iterable<Integer>> t : grouped.collect()) {
      List<Integer> vs = new ArrayList<>();
      t._2().forEach(vs::add);
      Collections.sort(vs);
      got.put(t._1(), vs);
    }
    assertEquals(expected, got);
    // The data went through NodeKernel: map indexes under this job's shuffle directory (not
    // any shuffle's: the ContextCleaner removes earlier tests' shuffles at any time).
    NodeKernel nk = CLUSTER.client();
    String dir =
        NkShuffleConf.DEFAULT_ROOT
            + "/"
            + sc.sc().applicationId()
            + "/s"
            + shuffleId(grouped.rdd());
    assertFalse("no map index in " + dir, nk.list(dir + "/idx").isEmpty());
    // The shuffle stays while its RDD is reachable.
    Reference.reachabilityFence(grouped);
  }

  /** The id of the shuffle nearest to {@code rdd} in its lineage. */
  private static int shuffleId(RDD<?> rdd) {
    while (true) {
      Dependency<?> d = rdd.dependencies().head();
      if (d instanceof ShuffleDependency<?, ?, ?> s) {
        return s.shuffleId();
      }
      rdd = d.rdd();
    }
  }

  @Test
  public void reduceByKeyCombinesOnTheMapSide() {
    Map<Integer, Long> expected = new TreeMap<>();
    for (Tuple2<Integer, Integer> p : pairs) {
      expected.merge(p._1(), (long) p._2(), Long::sum);
    }
    Map<Integer, Long> got =
        new TreeMap<>(input().mapValues(v -> (long) v).reduceByKey(Long::sum, 3).collectAsMap());
    assertEquals(expected, got);
  }

  @Test
  public void sortByKey() {
    Random r = new Random(7);
    List<Tuple2<Long, String>> data = new ArrayList<>();
    List<Long> keys = new ArrayList<>();
    for (int i = 0; i < N; i++) {
      long k = r.nextLong();
      keys.add(k);
      data.add(new Tuple2<>(k, "v" + i));
    }
    Collections.sort(keys);
    List<Long> got = sc.parallelizePairs(data, 4).sortByKey(true, 3).keys().collect();
    assertEquals(keys, got);
  }

  @Test
  public void repartition() {
    List<String> data = new ArrayList<>();
    for (int i = 0; i < N; i++) {
      data.add("row-" + i);
    }
    JavaRDD<String> out = sc.parallelize(data, 3).repartition(5);
    assertEquals(5, out.getNumPartitions());
    List<String> got = new ArrayList<>(out.collect());
    Collections.sort(got);
    List<String> expected = new ArrayList<>(data);
    Collections.sort(expected);
    assertEquals(expected, got);
    // No partition is left empty by round-robin repartitioning.
    for (int size : out.glom().map(List::size).collect()) {
      assertFalse(size == 0);
    }
  }

  @Test
  public void skewedKeys() {
    List<Tuple2<Integer, Integer>> data = new ArrayList<>();
    Map<Integer, Long> expected = new TreeMap<>();
    for (int i = 0; i < N; i++) {
      int k = i % 2 == 0 ? 0 : i % 31;
      data.add(new Tuple2<>(k, 1));
      expected.merge(k, 1L, Long::sum);
    }
    Map<Integer, Long> got =
        new TreeMap<>(
            sc.parallelizePairs(data, 4)
                .groupByKey(4)
                .mapValues(
                    vs -> {
                      long n = 0;
                      for (Integer v : vs) {
                        n += v;
                      }
                      return n;
                    })
                .collectAsMap());
    assertEquals(expected, got);
  }

  @Test
  public void sqlJoinAndAggregation() {
    SparkSession spark = SparkSession.builder().sparkContext(sc.sc()).getOrCreate();
    List<Row> left = new ArrayList<>();
    List<Row> right = new ArrayList<>();
    Map<Integer, Long> expected = new TreeMap<>();
    for (int i = 0; i < 5000; i++) {
      left.add(org.apache.spark.sql.RowFactory.create(i % 50, (long) i));
    }
    for (int k = 0; k < 50; k += 2) {
      right.add(org.apache.spark.sql.RowFactory.create(k, "name" + k));
    }
    for (int i = 0; i < 5000; i++) {
      if ((i % 50) % 2 == 0) {
        expected.merge(i % 50, (long) i, Long::sum);
      }
    }
    Dataset<Row> l =
        spark.createDataFrame(
            left, org.apache.spark.sql.types.StructType.fromDDL("k INT, v BIGINT"));
    Dataset<Row> r =
        spark.createDataFrame(
            right, org.apache.spark.sql.types.StructType.fromDDL("k INT, name STRING"));
    Dataset<Row> joined = l.join(r, "k").groupBy("k").agg(org.apache.spark.sql.functions.sum("v"));
    Map<Integer, Long> got = new TreeMap<>();
    for (Row row : joined.collectAsList()) {
      got.put(row.getInt(0), row.getLong(1));
    }
    assertEquals(expected, got);
  }
}

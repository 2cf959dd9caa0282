package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import io.nodekernel.NkInputStream;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeStatus;
import io.nodekernel.TestCluster;
import java.io.IOException;
import java.lang.ref.Reference;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.StructType;
import org.junit.ClassRule;
import org.junit.Test;
import scala.Tuple2;

/**
 * The NodeKernel shuffle under the settings that change what Spark writes and how it reads: the
 * Java serializer without compression and with forced spills, Kryo with I/O encryption, values
 * larger than a NodeKernel block, and an adaptive (AQE) skew join, whose reducers read ranges of
 * map outputs. Each job's result is computed here without Spark.
 */
public class ShuffleVariantsTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static final int N = 20_000;

  /** A string every serialized record of the marked job carries, to look for in stored bytes. */
  private static final String MARKER = "nodekernel-plaintext-marker";

  /** Values of 2.5 MiB: larger than a block, so segments span blocks. */
  private static final int BIG = 5 << 19;

  private static final int BIG_VALUES = 24;

  private static final long BIG_BYTES = (long) BIG_VALUES * BIG;

  private static SparkConf conf() {
    return ShuffleJobTest.conf("local[2]", CLUSTER.cluster())
        .set("spark.sql.shuffle.partitions", "4")
        .set("spark.sql.autoBroadcastJoinThreshold", "-1")
        .set("spark.sql.adaptive.enabled", "true")
        .set("spark.sql.adaptive.coalescePartitions.enabled", "false")
        .set("spark.sql.adaptive.skewJoin.enabled", "true")
        .set("spark.sql.adaptive.skewJoin.skewedPartitionFactor", "1")
        .set("spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes", "1k")
        .set("spark.sql.adaptive.advisoryPartitionSizeInBytes", "1k");
  }

  /** Value {@code i} of the big-value job: its number, then a pattern of it. */
  private static byte[] big(int i) {
    byte[] v = new byte[BIG];
    for (int j = 0; j < v.length; j++) {
      v[j] = (byte) (i * 31 + j);
    }
    return v;
  }

  /** What the jobs gave, and what they should have. */
  private record Results(
      Map<String, Object> got,
      Map<String, Object> expected,
      String plan,
      boolean plaintext,
      Map<String, Long> writers,
      long channels) {}

  private static Results run(SparkConf conf, ShuffleMetrics[] metrics) throws IOException {
    JavaSparkContext sc = new JavaSparkContext(conf);
    try {
      Map<String, Object> got = new TreeMap<>();
      Map<String, Object> expected = new TreeMap<>();
      metrics[0] = ShuffleMetrics.listen(sc.sc());

      List<Tuple2<Integer, String>> pairs = new ArrayList<>();
      Map<Integer, Integer> counts = new TreeMap<>();
      for (int i = 0; i < N; i++) {
        pairs.add(new Tuple2<>(i % 97, MARKER + i));
        counts.merge(i % 97, 1, Integer::sum);
      }
      JavaPairRDD<Integer, Iterable<String>> grouped = sc.parallelizePairs(pairs, 4).groupByKey(3);
      got.put(
          "groupByKey",
          new TreeMap<>(
              grouped
                  .mapValues(
                      vs -> {
                        int n = 0;
                        for (String v : vs) {
                          n += v.startsWith(MARKER) ? 1 : 0;
                        }
                        return n;
                      })
                  .collectAsMap()));
      expected.put("groupByKey", counts);
      // Before the ContextCleaner could remove the shuffle (it may once the RDD is collected).
      boolean plaintext = stored(MARKER);
      Reference.reachabilityFence(grouped);

      List<Tuple2<Integer, Integer>> unique = new ArrayList<>();
      List<Integer> keys = new ArrayList<>();
      for (int i = 0; i < N; i++) {
        unique.add(new Tuple2<>(Integer.reverse(i), i));
        keys.add(Integer.reverse(i));
      }
      Collections.sort(keys);
      got.put("sortByKey", sc.parallelizePairs(unique, 4).sortByKey(true, 3).keys().collect());
      expected.put("sortByKey", keys);

      // Generated in the map tasks; each reducer checks every byte and returns the value numbers.
      Map<Integer, List<Integer>> bigExpected = new TreeMap<>();
      List<Integer> numbers = new ArrayList<>();
      for (int i = 0; i < BIG_VALUES; i++) {
        numbers.add(i);
        bigExpected.computeIfAbsent(i % 6, k -> new ArrayList<>()).add(i);
      }
      Map<Integer, List<Integer>> bigGot = new TreeMap<>();
      for (Tuple2<Integer, List<Integer>> t :
          sc.parallelize(numbers, 4)
              .mapToPair(i -> new Tuple2<>(i % 6, big(i)))
              .groupByKey(3)
              .mapValues(
                  vs -> {
                    List<Integer> ids = new ArrayList<>();
                    for (byte[] v : vs) {
                      int i = 0;
                      while (i < BIG_VALUES && v[0] != (byte) (i * 31)) {
                        i++;
                      }
                      if (i == BIG_VALUES || !java.util.Arrays.equals(v, big(i))) {
                        throw new IllegalStateException("a big value came back changed");
                      }
                      ids.add(i);
                    }
                    Collections.sort(ids);
                    return ids;
                  })
              .collect()) {
        bigGot.put(t._1(), t._2());
      }
      got.put("bigValues", bigGot);
      expected.put("bigValues", bigExpected);

      // Half the rows on key 0: AQE splits that partition into map-index ranges.
      SparkSession spark = SparkSession.builder().sparkContext(sc.sc()).getOrCreate();
      List<Row> left = new ArrayList<>();
      List<Row> right = new ArrayList<>();
      Map<Integer, Long> sums = new TreeMap<>();
      for (int i = 0; i < N; i++) {
        int k = i % 2 == 0 ? 0 : i % 40;
        left.add(RowFactory.create(k, (long) i));
        sums.merge(k, (long) i, Long::sum);
      }
      for (int k = 0; k < 40; k++) {
        right.add(RowFactory.create(k, "name" + k));
      }
      // The sums are taken here: an aggregation by k after the join would need the join's
      // partitioning, and AQE does not split a skewed partition where that costs a shuffle.
      Dataset<Row> joined =
          spark
              .createDataFrame(left, StructType.fromDDL("k INT, v BIGINT"))
              .repartition(4)
              .join(spark.createDataFrame(right, StructType.fromDDL("k INT, name STRING")), "k");
      Map<Integer, Long> joinGot = new TreeMap<>();
      for (Row row : joined.collectAsList()) {
        if (!row.getString(2).equals("name" + row.getInt(0))) {
          throw new AssertionError("joined wrongly: " + row);
        }
        joinGot.merge(row.getInt(0), row.getLong(1), Long::sum);
      }
      got.put("skewJoin", joinGot);
      expected.put("skewJoin", sums);
      String plan = joined.queryExecution().executedPlan().toString();
      metrics[0].close();
      long channels = ((NodeKernelShuffleManager) SparkEnv.get().shuffleManager()).channelsOpened();
      return new Results(got, expected, plan, plaintext, ShuffleJobTest.writersUsed(), channels);
    } finally {
      sc.stop();
      SparkSession.clearActiveSession();
      SparkSession.clearDefaultSession();
    }
  }

  /** Whether the bytes of any slot File of the cluster contain {@code s}. */
  private static boolean stored(String s) throws IOException {
    NodeKernel nk = CLUSTER.client();
    byte[] needle = s.getBytes(StandardCharsets.UTF_8);
    List<String> dirs = new ArrayList<>(List.of(NkShuffleConf.DEFAULT_ROOT));
    while (!dirs.isEmpty()) {
      String dir = dirs.remove(dirs.size() - 1);
      List<NodeStatus> entries;
      try {
        entries = nk.list(dir);
      } catch (NodeKernelException.NotFound e) {
        continue; // removed meanwhile (the ContextCleaner): it holds nothing any more
      }
      for (NodeStatus st : entries) {
        String path = st.path().startsWith("/") ? st.path() : dir + "/" + st.path();
        switch (st.type()) {
          case DIRECTORY, BAG -> dirs.add(path);
          case FILE -> {
            try (NkInputStream in = nk.open(path)) {
              String bytes = new String(in.readAllBytes(), StandardCharsets.ISO_8859_1);
              if (bytes.contains(new String(needle, StandardCharsets.ISO_8859_1))) {
                return true;
              }
            } catch (NodeKernelException.NotFound e) {
              // Removed meanwhile, as above.
            }
          }
          default -> {}
        }
      }
    }
    return false;
  }

  private static void check(String variant, Results r, ShuffleMetrics m) {
    assertEquals(r.expected().keySet(), r.got().keySet());
    for (String job : r.expected().keySet()) {
      assertEquals(variant + ": " + job, r.expected().get(job), r.got().get(job));
    }
    assertTrue(variant + ": AQE split no skewed partition: " + r.plan(), r.plan().contains("skew"));
    // Not equal: the skew join reads the other side's partition once per split of the skewed one.
    assertTrue(variant + ": bytes written " + m.bytesWritten, m.bytesWritten > BIG_BYTES);
    assertTrue(variant + ": bytes read " + m.bytesRead, m.bytesRead >= m.bytesWritten);
  }

  /**
   * The Java serializer, no compression, a spill every 500 records (map and reduce sides), and
   * Spark's bypass threshold at 0 (so {@code SortShuffleWriter} and {@code UnsafeShuffleWriter}
   * merge their spills): the records are stored as written, so their text is in NodeKernel's Files.
   */
  @Test
  public void javaSerializerUncompressedWithForcedSpills() throws IOException {
    ShuffleMetrics[] m = new ShuffleMetrics[1];
    Results r =
        run(
            conf()
                .set("spark.shuffle.sort.bypassMergeThreshold", "0")
                .set("spark.shuffle.compress", "false")
                .set("spark.shuffle.spill.compress", "false")
                .set("spark.shuffle.spill.numElementsForceSpillThreshold", "500"),
            m);
    check("java serializer", r, m[0]);
    // Above the bypass threshold, records the Java serializer wrote cannot be relocated:
    // SortShuffleWriter; SQL's exchanges have a serializer of their own that allows it.
    assertEquals(Set.of("SortShuffleWriter", "UnsafeShuffleWriter"), r.writers().keySet());
    assertTrue("no spill", m[0].diskBytesSpilled > 0);
    // UnsafeShuffleWriter merged its spills with transferTo into the segments' channels.
    assertTrue("no partition written as a channel", r.channels() > 0);
    assertTrue("records not found in NodeKernel's Files as written", r.plaintext());
  }

  /**
   * Kryo with I/O encryption, and Spark's bypass threshold at 0, so that every map task without
   * map-side combine goes through {@code UnsafeShuffleWriter}: the shuffle works and NodeKernel
   * holds no plaintext record.
   */
  @Test
  public void kryoWithIoEncryptionThroughUnsafeShuffleWriter() throws IOException {
    ShuffleMetrics[] m = new ShuffleMetrics[1];
    Results r =
        run(
            conf()
                .set("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
                .set("spark.shuffle.sort.bypassMergeThreshold", "0")
                .set("spark.shuffle.compress", "false")
                .set("spark.io.encryption.enabled", "true"),
            m);
    assertEquals(Set.of("UnsafeShuffleWriter"), r.writers().keySet());
    check("encrypted", r, m[0]);
    assertFalse("a record is stored in plaintext", r.plaintext());
  }
}

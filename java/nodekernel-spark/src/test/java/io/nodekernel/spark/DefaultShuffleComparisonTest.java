package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;

import io.nodekernel.TestCluster;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.shuffle.ShuffleManager;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.StructType;
import org.junit.ClassRule;
import org.junit.Test;
import scala.Tuple2;

/**
 * The same jobs on Spark's default shuffle and on NodeKernel's ({@code local[2]} and {@code
 * local[4]}) give equal results: groupByKey, reduceByKey, sortByKey, repartition, skewed keys, a
 * SQL join with aggregation.
 */
public class DefaultShuffleComparisonTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static final int N = 20_000;

  /** Not a job: which shuffle manager ran them. */
  private static final String MANAGER = "~manager";

  private static List<String> sorted(List<String> rows) {
    List<String> out = new ArrayList<>(rows);
    Collections.sort(out);
    return out;
  }

  /** Every job's result, as strings (sorted where the job does not define an order). */
  private static Map<String, List<String>> runAll(SparkConf conf) {
    JavaSparkContext sc = new JavaSparkContext(conf);
    try {
      Map<String, List<String>> out = new TreeMap<>();
      List<Tuple2<Integer, Integer>> pairs = new ArrayList<>();
      List<Tuple2<String, Integer>> unique = new ArrayList<>();
      List<Tuple2<Integer, Integer>> skewed = new ArrayList<>();
      List<String> rows = new ArrayList<>();
      for (int i = 0; i < N; i++) {
        pairs.add(new Tuple2<>(i % 97, i));
        unique.add(new Tuple2<>("k" + Integer.reverse(i), i));
        skewed.add(new Tuple2<>(i % 2 == 0 ? 0 : i % 31, 1));
        rows.add("row-" + i);
      }
      JavaPairRDD<Integer, Integer> in = sc.parallelizePairs(pairs, 4);
      out.put(
          "groupByKey",
          sorted(
              in.groupByKey(3)
                  .map(
                      t -> {
                        List<Integer> vs = new ArrayList<>();
                        t._2().forEach(vs::add);
                        Collections.sort(vs);
                        return t._1() + "=" + vs;
                      })
                  .collect()));
      out.put(
          "reduceByKey", sorted(in.reduceByKey(Integer::sum, 3).map(Tuple2::toString).collect()));
      out.put(
          "sortByKey",
          sc.parallelizePairs(unique, 4).sortByKey(true, 3).map(Tuple2::toString).collect());
      out.put("repartition", sorted(sc.parallelize(rows, 3).repartition(5).collect()));
      out.put(
          "skewed",
          sorted(
              sc.parallelizePairs(skewed, 4)
                  .groupByKey(4)
                  .map(
                      t -> {
                        long n = 0;
                        for (Integer v : t._2()) {
                          n += v;
                        }
                        return t._1() + "=" + n;
                      })
                  .collect()));
      SparkSession spark = SparkSession.builder().sparkContext(sc.sc()).getOrCreate();
      List<Row> left = new ArrayList<>();
      List<Row> right = new ArrayList<>();
      for (int i = 0; i < 5000; i++) {
        left.add(RowFactory.create(i % 50, (long) i));
      }
      for (int k = 0; k < 50; k += 2) {
        right.add(RowFactory.create(k, "name" + k));
      }
      Dataset<Row> l = spark.createDataFrame(left, StructType.fromDDL("k INT, v BIGINT"));
      Dataset<Row> r = spark.createDataFrame(right, StructType.fromDDL("k INT, name STRING"));
      List<String> joined = new ArrayList<>();
      for (Row row : l.join(r, "k").groupBy("k", "name").agg(functions.sum("v")).collectAsList()) {
        joined.add(row.toString());
      }
      out.put("sqlJoinAndAggregation", sorted(joined));
      ShuffleManager manager = SparkEnv.get().shuffleManager();
      String name = manager.getClass().getName();
      if (manager instanceof NodeKernelShuffleManager m) {
        // Which writers ran: the first besides SortShuffleWriter (map-side combine), then it.
        Set<String> writers = new TreeSet<>(m.writersUsed().keySet());
        writers.remove("SortShuffleWriter");
        name += " " + String.join(" ", writers) + " SortShuffleWriter";
      }
      out.put(MANAGER, List.of(name));
      return out;
    } finally {
      sc.stop();
      SparkSession.clearActiveSession();
      SparkSession.clearDefaultSession();
    }
  }

  private static SparkConf base(String master) {
    return new SparkConf()
        .setMaster(master)
        .setAppName("nodekernel-vs-default-shuffle")
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.sql.shuffle.partitions", "4")
        .set("spark.sql.autoBroadcastJoinThreshold", "-1");
  }

  @Test
  public void everyJobGivesTheSameResultsAsOnTheDefaultShuffle() {
    Map<String, List<String>> standard = runAll(base("local[2]"));
    assertEquals(
        List.of("org.apache.spark.shuffle.sort.SortShuffleManager"), standard.remove(MANAGER));
    for (String master : new String[] {"local[2]", "local[4]"}) {
      // local[2]: the map tasks without map-side combine go through NkDirectWriter; local[4]:
      // with Spark's bypass threshold at 0, through UnsafeShuffleWriter (Kryo).
      SparkConf conf =
          base(master)
              .set("spark.shuffle.manager", NodeKernelShuffleManager.class.getName())
              .set(NkShuffleConf.META, CLUSTER.cluster().meta())
              .set(NkShuffleConf.CONFIG, CLUSTER.cluster().clientConfig());
      String writer = "NkDirectWriter";
      if (master.equals("local[4]")) {
        conf.set("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
            .set("spark.shuffle.sort.bypassMergeThreshold", "0");
        writer = "UnsafeShuffleWriter";
      }
      Map<String, List<String>> nk = runAll(conf);
      assertEquals(
          List.of(NodeKernelShuffleManager.class.getName() + " " + writer + " SortShuffleWriter"),
          nk.remove(MANAGER));
      assertEquals(standard.keySet(), nk.keySet());
      for (String job : standard.keySet()) {
        assertFalse(job + " gave nothing", standard.get(job).isEmpty());
        assertEquals(job + " on " + master, standard.get(job), nk.get(job));
      }
    }
  }
}

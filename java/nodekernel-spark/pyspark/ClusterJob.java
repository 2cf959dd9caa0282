package io.nodekernel.clustertest;

import io.nodekernel.spark.NkBroadcast;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Collectors;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import scala.Tuple2;

/**
 * A Java application the cluster test (test_cluster.py) compiles against the Spark it runs, packs
 * into a jar and starts with {@code spark-submit --class}, as a user's own application would be: a
 * reduceByKey, a groupByKey and a sortByKey of generated pairs, and an {@link NkBroadcast} read by
 * every task. Each job has a job group of its own (the test finds its tasks in the event log).
 *
 * <p>Arguments: {@code OUT EXECUTORS N KEYS}. Writes to OUT, as JSON, the application id, the
 * shuffle manager's class, each job's result (sorted pairs; the sort's pairs in the order the job
 * returned them) and the broadcast's per-task checks.
 */
public final class ClusterJob {
  private ClusterJob() {}

  public static void main(String[] args) throws Exception {
    String out = args[0];
    int executors = Integer.parseInt(args[1]);
    int n = Integer.parseInt(args[2]);
    int keys = Integer.parseInt(args[3]);
    JavaSparkContext sc = new JavaSparkContext(new SparkConf().setAppName("nodekernel-java-job"));
    StringBuilder json = new StringBuilder("{");
    try {
      // Every executor registered, so that the jobs' tasks spread over the hosts.
      long deadline = System.nanoTime() + 600_000_000_000L;
      while (sc.sc().getExecutorMemoryStatus().size() < executors + 1) {
        if (System.nanoTime() > deadline) {
          throw new IllegalStateException("fewer than " + executors + " executors registered");
        }
        Thread.sleep(200);
      }
      List<Integer> range = new ArrayList<>(n);
      for (int i = 0; i < n; i++) {
        range.add(i);
      }
      JavaPairRDD<Integer, Long> pairs =
          sc.parallelize(range, 6).mapToPair(i -> new Tuple2<>(i % keys, (long) i));

      sc.setJobGroup("javaReduceByKey", "javaReduceByKey", false);
      Map<Integer, Long> sums = new TreeMap<>(pairs.reduceByKey(Long::sum, 4).collectAsMap());
      field(json, "javaReduceByKey", pairsJson(sums));

      sc.setJobGroup("javaGroupByKey", "javaGroupByKey", false);
      Map<Integer, List<Long>> groups = new TreeMap<>();
      for (Tuple2<Integer, Iterable<Long>> g : pairs.groupByKey(4).collect()) {
        List<Long> vs = new ArrayList<>();
        g._2().forEach(vs::add);
        Collections.sort(vs);
        groups.put(g._1(), vs);
      }
      field(json, "javaGroupByKey", pairsJson(groups));

      sc.setJobGroup("javaSortByKey", "javaSortByKey", false);
      List<Tuple2<Integer, Integer>> sorted =
          sc.parallelize(range, 6)
              .mapToPair(i -> new Tuple2<>((int) ((i * 7919L) % 10_007), i))
              .sortByKey(true, 4)
              .collect();
      field(
          json,
          "javaSortByKey",
          sorted.stream()
              .map(t -> "[" + t._1() + "," + t._2() + "]")
              .collect(Collectors.joining(",", "[", "]")));

      // Every task reads the broadcast value (8 MB of longs) and returns its sum; each takes half
      // a second, so that the tasks spread over the executors.
      sc.setJobGroup("javaBroadcast", "javaBroadcast", false);
      long[] value = new long[1 << 20];
      long want = 0;
      for (int i = 0; i < value.length; i++) {
        value[i] = i * 31L;
        want += value[i];
      }
      Broadcast<long[]> b = NkBroadcast.create(sc, value);
      List<Long> got =
          sc.parallelize(range, 6)
              .mapPartitions(
                  it -> {
                    Thread.sleep(500);
                    long s = 0;
                    for (long v : b.value()) {
                      s += v;
                    }
                    return Collections.singletonList(s).iterator();
                  })
              .collect();
      b.destroy();
      field(json, "javaBroadcast", "{\"want\":" + want + ",\"got\":" + got + "}");

      field(json, "app", "\"" + sc.sc().applicationId() + "\"");
      field(json, "manager", "\"" + SparkEnv.get().shuffleManager().getClass().getName() + "\"");
    } finally {
      sc.stop();
    }
    json.setCharAt(json.length() - 1, '}');
    write(out, json.toString());
  }

  private static void field(StringBuilder json, String name, String value) {
    json.append('"').append(name).append("\":").append(value).append(',');
  }

  private static String pairsJson(Map<Integer, ?> m) {
    return m.entrySet().stream()
        .map(e -> "[" + e.getKey() + "," + e.getValue() + "]")
        .collect(Collectors.joining(",", "[", "]"));
  }

  private static void write(String path, String text) throws IOException {
    Files.write(Paths.get(path), text.getBytes(StandardCharsets.UTF_8));
  }
}

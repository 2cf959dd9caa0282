package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import io.nodekernel.CreateOptions;
import io.nodekernel.NkOutputStream;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeStatus;
import io.nodekernel.NodeType;
import io.nodekernel.TestCluster;
import java.io.IOException;
import java.io.ObjectOutputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.lang.ref.Reference;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.FetchFailed;
import org.apache.spark.HashPartitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.ExecutorProcessLost;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerStageSubmitted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.junit.ClassRule;
import org.junit.Test;
import scala.Option;
import scala.Tuple2;

/**
 * Each test with its own SparkContext: more task threads than the other tests, a map task failing
 * in the middle of its output, and the shuffle data removed by the ContextCleaner and at stop.
 */
public class ShuffleLifecycleTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static JavaSparkContext context(String master) {
    return new JavaSparkContext(ShuffleJobTest.conf(master, CLUSTER.cluster()));
  }

  private static String appDir(JavaSparkContext sc) {
    return NkShuffleConf.DEFAULT_ROOT + "/" + sc.sc().applicationId();
  }

  private static List<Tuple2<Integer, Long>> pairs(int n, int keys) {
    List<Tuple2<Integer, Long>> pairs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      pairs.add(new Tuple2<>(i % keys, (long) i));
    }
    return pairs;
  }

  private static Map<Integer, Long> sums(List<Tuple2<Integer, Long>> pairs) {
    Map<Integer, Long> sums = new TreeMap<>();
    for (Tuple2<Integer, Long> p : pairs) {
      sums.merge(p._1(), p._2(), Long::sum);
    }
    return sums;
  }

  @Test
  public void fourTaskThreads() {
    JavaSparkContext sc = context("local[4]");
    try {
      List<Tuple2<Integer, Long>> data = pairs(40_000, 1000);
      Map<Integer, Long> got =
          new TreeMap<>(sc.parallelizePairs(data, 8).reduceByKey(Long::sum, 6).collectAsMap());
      assertEquals(sums(data), got);
    } finally {
      sc.stop();
    }
  }

  @Test
  public void shuffleDataIsRemovedByTheCleanerAndAtStop() throws IOException {
    NodeKernel nk = CLUSTER.client();
    JavaSparkContext sc = context("local[2]");
    String app;
    try {
      app = appDir(sc);
      List<Tuple2<Integer, Long>> data = pairs(10_000, 50);
      JavaPairRDD<Integer, Long> reduced = sc.parallelizePairs(data, 4).reduceByKey(Long::sum, 3);
      assertEquals(sums(data), new TreeMap<>(reduced.collectAsMap()));
      int shuffleId =
          ((ShuffleDependency<?, ?, ?>) reduced.rdd().dependencies().head()).shuffleId();
      String dir = app + "/s" + shuffleId;
      assertFalse(nk.list(dir + "/idx").isEmpty());
      sc.sc().cleaner().get().doCleanupShuffle(shuffleId, true);
      assertFalse(dir + " left after the cleaner removed the shuffle", nk.exists(dir));

      assertEquals(
          sums(data),
          new TreeMap<>(sc.parallelizePairs(data, 4).reduceByKey(Long::sum, 3).collectAsMap()));
      assertTrue(nk.exists(app));
      // Bound to the driver's session (DriverSessionTest), with no lease KeyValue of its own.
      assertFalse(
          nk.exists(
              NkShuffleCleaner.leasePath(NkShuffleConf.DEFAULT_ROOT, sc.sc().applicationId())));
    } finally {
      sc.stop();
    }
    assertFalse(app + " left after SparkContext.stop()", nk.exists(app));
  }

  /** Fetch failures and retried stages, as the scheduler reports them. */
  static final class Retries extends SparkListener {
    final List<FetchFailed> fetchFailures = new CopyOnWriteArrayList<>();
    final List<Integer> retriedStages = new CopyOnWriteArrayList<>();

    @Override
    public void onTaskEnd(SparkListenerTaskEnd end) {
      if (end.reason() instanceof FetchFailed f) {
        fetchFailures.add(f);
      }
    }

    @Override
    public void onStageSubmitted(SparkListenerStageSubmitted submitted) {
      if (submitted.stageInfo().attemptNumber() > 0) {
        retriedStages.add(submitted.stageInfo().stageId());
      }
    }
  }

  /**
   * A segment lost after its map stage finished (its slot File deleted) fails the reducer's fetch
   * with a FetchFailed naming the shuffle and the map output; Spark then runs the map stage again
   * and the job gives the right result.
   */
  @Test
  public void aLostSegmentFailsTheFetchAndTheMapStageRunsAgain() throws IOException {
    NodeKernel nk = CLUSTER.client();
    JavaSparkContext sc = context("local[2]");
    try {
      List<Tuple2<Integer, Long>> data = pairs(10_000, 50);
      JavaPairRDD<Integer, Long> reduced = sc.parallelizePairs(data, 4).reduceByKey(Long::sum, 3);
      // Runs the map stage; its outputs stay registered for the next job on the same RDD.
      assertEquals(50, reduced.count());
      int shuffleId =
          ((ShuffleDependency<?, ?, ?>) reduced.rdd().dependencies().head()).shuffleId();
      String bag = appDir(sc) + "/s" + shuffleId + "/p1";
      List<NodeStatus> files = nk.list(bag);
      assertFalse("no slot File in " + bag, files.isEmpty());
      String lost = files.get(0).path();
      lost = lost.startsWith("/") ? lost : bag + "/" + lost;
      nk.delete(lost, false);

      Retries retries = new Retries();
      sc.sc().addSparkListener(retries);
      assertEquals(sums(data), new TreeMap<>(reduced.collectAsMap()));
      ShuffleMetrics.drain(sc.sc());
      // Reads of segments failed only in partition 1, each blamed on a segment of the lost File
      // (the first line; the causes follow). A reduce task started after the first failure had
      // the map outputs unregistered finds none: Spark's own FetchFailed, with no map (-1).
      List<FetchFailed> reads = new ArrayList<>();
      for (FetchFailed f : retries.fetchFailures) {
        assertEquals(shuffleId, f.shuffleId());
        if (f.mapIndex() >= 0) {
          reads.add(f);
          assertEquals(1, f.reduceId());
          assertTrue(f.message(), f.message().lines().findFirst().orElse("").contains(lost));
        } else {
          assertTrue(f.message(), f.message().contains("Missing an output location"));
        }
      }
      assertFalse("no fetch failure of a segment: " + retries.fetchFailures, reads.isEmpty());
      assertFalse("no stage ran again", retries.retriedStages.isEmpty());
    } finally {
      sc.stop();
    }
  }

  /** Counts the map tasks that end. */
  static final class MapTasks extends SparkListener {
    final AtomicLong ended = new AtomicLong();

    @Override
    public void onTaskEnd(SparkListenerTaskEnd end) {
      if (end.taskType().equals("ShuffleMapTask")) {
        ended.incrementAndGet();
      }
    }
  }

  /**
   * Map outputs are in NodeKernel, not in the executor that wrote them: when that executor is lost,
   * Spark keeps its map outputs (the manager declares reliable storage through {@link
   * NkShuffleDataIO}) and the next job reads them without running the map tasks again. With Spark's
   * local-disk plugin configured explicitly, the manager leaves it, and the map tasks run again.
   */
  @Test
  public void mapOutputsOutliveALostExecutor() {
    String localDisk = "org.apache.spark.shuffle.sort.io.LocalDiskShuffleDataIO";
    for (String plugin : new String[] {null, localDisk}) {
      SparkConf conf = ShuffleJobTest.conf("local[2]", CLUSTER.cluster());
      if (plugin != null) {
        conf.set(NkShuffleDataIO.PLUGIN, plugin);
      }
      JavaSparkContext sc = new JavaSparkContext(conf);
      try {
        assertEquals(
            plugin == null ? NkShuffleDataIO.class.getName() : plugin,
            sc.getConf().get(NkShuffleDataIO.PLUGIN));
        List<Tuple2<Integer, Long>> data = pairs(10_000, 50);
        JavaPairRDD<Integer, Long> reduced = sc.parallelizePairs(data, 4).reduceByKey(Long::sum, 3);
        assertEquals(50, reduced.count());
        // Local mode's one executor is the driver's.
        sc.sc()
            .dagScheduler()
            .executorLost(
                "driver", new ExecutorProcessLost("lost in a test", Option.empty(), false));
        MapTasks mapTasks = new MapTasks();
        sc.sc().addSparkListener(mapTasks);
        assertEquals(sums(data), new TreeMap<>(reduced.collectAsMap()));
        ShuffleMetrics.drain(sc.sc());
        if (plugin == null) {
          assertEquals("map tasks ran again", 0, mapTasks.ended.get());
        } else {
          assertEquals(4, mapTasks.ended.get());
        }
      } finally {
        sc.stop();
      }
    }
  }

  /** The task attempt ids of map tasks made to fail. */
  static final AtomicLong FAILED = new AtomicLong(-1);

  /** A value whose serialization fails in the first attempt of map task 1, when {@code boom}. */
  static final class Bomb implements Serializable {
    final long value;
    final boolean boom;

    Bomb(long value, boolean boom) {
      this.value = value;
      this.boom = boom;
    }

    private void writeObject(ObjectOutputStream out) throws IOException {
      TaskContext ctx = TaskContext.get();
      if (boom && ctx != null && ctx.attemptNumber() == 0 && ctx.partitionId() == 1) {
        FAILED.set(ctx.taskAttemptId());
        throw new IOException("bomb: map task 1 fails in the middle of its output");
      }
      out.defaultWriteObject();
    }
  }

  /**
   * A slot File that cannot be opened when a segment's bytes first reach it fails the map task, and
   * its retry writes the output. With Kryo and compression that first write is LZ4's last block,
   * inside Kryo's {@code Output.close()}, which swallows the IOException: the task used to commit
   * an empty output for the partition, and the job's result silently lacked those records (seen
   * after a storage server was killed: the slot File was Busy with the lease of an attempt that had
   * failed on it).
   */
  @Test
  public void aSlotFileThatCannotBeOpenedFailsTheMapTask() throws IOException {
    NodeKernel nk = CLUSTER.client();
    // local[2,4]: up to three retries per task.
    JavaSparkContext sc =
        new JavaSparkContext(
            ShuffleJobTest.conf("local[2,4]", CLUSTER.cluster())
                .set("spark.serializer", "org.apache.spark.serializer.KryoSerializer"));
    List<NkOutputStream> held = new CopyOnWriteArrayList<>();
    List<String> failures = new CopyOnWriteArrayList<>();
    sc.sc()
        .addSparkListener(
            new SparkListener() {
              @Override
              public void onTaskEnd(SparkListenerTaskEnd end) {
                if (!end.reason().toString().equals("Success")) {
                  failures.add(end.reason().toString());
                  for (NkOutputStream out : held) {
                    try {
                      out.abort(); // the retries find the slot Files free
                    } catch (IOException e) {
                      throw new UncheckedIOException(e);
                    }
                  }
                }
              }
            });
    try {
      List<Tuple2<Integer, Long>> data = pairs(8000, 8);
      // No map-side combine, 4 partitions: NkDirectWriter.
      JavaPairRDD<Integer, Long> parted =
          sc.parallelizePairs(data, 4).partitionBy(new HashPartitioner(4));
      int shuffleId = ((ShuffleDependency<?, ?, ?>) parted.rdd().dependencies().head()).shuffleId();
      // Another writer holds partition 0's slot Files of both task slots.
      String bag = appDir(sc) + "/s" + shuffleId + "/p0";
      nk.createContainer(bag, NodeType.BAG, CreateOptions.defaults());
      for (int slot = 0; slot < 2; slot++) {
        held.add(nk.appendOrCreate(bag + "/edriver-t" + slot, CreateOptions.defaults()));
      }
      Map<Integer, Long> got = new TreeMap<>();
      for (Tuple2<Integer, Long> t : parted.collect()) {
        got.merge(t._1(), t._2(), Long::sum);
      }
      assertEquals(sums(data), got);
      assertFalse("no map task failed", failures.isEmpty());
      assertTrue(failures.toString(), failures.get(0).contains("was not written"));
    } finally {
      sc.stop();
    }
  }

  @Test
  public void aMapTaskFailingMidWriteIsRetried() throws IOException {
    // With NkDirectWriter every segment is open when the task fails; with SortShuffleWriter
    // (Spark's bypass threshold at 0) partitions 0 to 2 are published before partition 3 fails.
    for (String threshold : new String[] {"200", "0"}) {
      FAILED.set(-1);
      failMidWrite(threshold);
    }
  }

  private void failMidWrite(String bypassThreshold) throws IOException {
    NodeKernel nk = CLUSTER.client();
    // local[2,2]: one retry per task.
    JavaSparkContext sc =
        new JavaSparkContext(
            ShuffleJobTest.conf("local[2,2]", CLUSTER.cluster())
                .set("spark.shuffle.sort.bypassMergeThreshold", bypassThreshold));
    try {
      List<Tuple2<Integer, Long>> data = pairs(8000, 8);
      // HashPartitioner(4): keys 3 and 7 go to the last partition and fail to serialize in map
      // task 1's first attempt.
      JavaPairRDD<Integer, Iterable<Bomb>> grouped =
          sc.parallelizePairs(data, 4)
              .mapToPair(t -> new Tuple2<>(t._1(), new Bomb(t._2(), t._1() % 4 == 3)))
              .groupByKey(4);
      Map<Integer, Long> got = new TreeMap<>();
      for (Tuple2<Integer, Iterable<Bomb>> t : grouped.collect()) {
        long sum = 0;
        for (Bomb b : t._2()) {
          sum += b.value;
        }
        got.put(t._1(), sum);
      }
      assertEquals(sums(data), got);
      String writer = bypassThreshold.equals("0") ? "SortShuffleWriter" : "NkDirectWriter";
      // Four map tasks and the retry.
      assertEquals(Map.of(writer, 5L), ShuffleJobTest.writersUsed());
      long failed = FAILED.get();
      assertTrue("no map task failed", failed >= 0);
      // The job's one shuffle.
      List<NodeStatus> shuffles = nk.list(appDir(sc));
      assertEquals(1, shuffles.size());
      String s0 = shuffles.get(0).path();
      String idx = (s0.startsWith("/") ? s0 : appDir(sc) + "/" + s0) + "/idx";
      List<NodeStatus> indexes = nk.list(idx);
      assertEquals(4, indexes.size());
      for (NodeStatus s : indexes) {
        assertFalse(s.path().endsWith("/m" + failed) || s.path().equals("m" + failed));
      }
      // The ContextCleaner removes the shuffle once its RDD is unreachable.
      Reference.reachabilityFence(grouped);
    } finally {
      sc.stop();
    }
  }
}

package io.nodekernel.spark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import io.nodekernel.NodeKernel;
import io.nodekernel.NodeStatus;
import io.nodekernel.NodeType;
import io.nodekernel.TestCluster;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.TreeMap;
import org.apache.spark.SparkEnv;
import org.apache.spark.SparkException;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.shuffle.sort.SortShuffleManager;
import org.junit.ClassRule;
import org.junit.Test;
import scala.Tuple2;

/**
 * {@link NkBroadcast} in local mode (driver and executor share one JVM, and so the per-JVM cache):
 * one SparkContext with the NodeKernel shuffle manager and Kryo, one with Spark's own sort shuffle
 * and the Java serializer.
 */
public class BroadcastTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  /** Tasks of each job: more than the two task threads, so that tasks share the cached value. */
  private static final int TASKS = 8;

  private static String appDir(JavaSparkContext sc) {
    return NkShuffleConf.DEFAULT_ROOT + "/" + sc.sc().applicationId();
  }

  private static List<Integer> range(int n) {
    List<Integer> r = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      r.add(i);
    }
    return r;
  }

  /** Each task sums every TASKS-th element of the broadcast array, from its own offset. */
  private static long sumInTasks(JavaSparkContext sc, NkBroadcast<long[]> bc) {
    JavaRDD<Integer> offsets = sc.parallelize(range(TASKS), TASKS);
    return offsets
        .map(
            k -> {
              long[] v = bc.value();
              long s = 0;
              for (int j = k; j < v.length; j += TASKS) {
                s += v[j];
              }
              return s;
            })
        .reduce(Long::sum);
  }

  private static boolean mentions(Throwable t, String text) {
    for (; t != null; t = t.getCause()) {
      if (String.valueOf(t.getMessage()).contains(text)) {
        return true;
      }
    }
    return false;
  }

  /**
   * An 8 MiB array (random, so it does not compress) is one File in NodeKernel; tasks read it from
   * there once per JVM, keep reading the cached copy, and read it again after unpersist; the File
   * is gone after stop(). With a shuffle in the same application, so that the application's
   * directory holds shuffle data too.
   */
  @Test
  public void largeValueIsReadFromNodeKernelOncePerJvmAndRemovedAtStop() throws IOException {
    NodeKernel nk = CLUSTER.client();
    JavaSparkContext sc =
        new JavaSparkContext(
            ShuffleJobTest.conf("local[2]", CLUSTER.cluster())
                .set("spark.serializer", "org.apache.spark.serializer.KryoSerializer"));
    String app;
    String path;
    try {
      app = appDir(sc);
      SplittableRandom random = new SplittableRandom(19);
      long[] big = new long[1 << 20];
      long sum = 0;
      for (int i = 0; i < big.length; i++) {
        big[i] = random.nextLong();
        sum += big[i];
      }
      NkBroadcast<long[]> bc = NkBroadcast.create(sc, big);
      path = bc.path();
      assertTrue(path + " is not under " + app, path.startsWith(app + "/"));
      NodeStatus st = nk.lookup(path);
      assertEquals(NodeType.FILE, st.type());
      assertTrue("File of " + st.size() + " bytes for an 8 MiB value", st.size() > (4 << 20));

      // Drop the driver's copy, so that the tasks read the File (one JVM in local mode).
      bc.unpersist();
      long reads = NkBroadcast.reads();
      assertEquals(sum, sumInTasks(sc, bc));
      assertEquals("reads by " + TASKS + " tasks", reads + 1, NkBroadcast.reads());
      long[] held = bc.value(); // the cached copy; this reference keeps it from the GC
      assertEquals(reads + 1, NkBroadcast.reads());
      assertArrayEquals(big, held);

      // Cached: a shuffle job using it reads nothing.
      Map<Integer, Long> expected = new TreeMap<>();
      for (int k = 0; k < 1000; k++) {
        expected.merge(k % 7, big[k * 1000], Long::sum);
      }
      Map<Integer, Long> got =
          new TreeMap<>(
              sc.parallelize(range(1000), TASKS)
                  .mapToPair(k -> new Tuple2<>(k % 7, bc.value()[k * 1000]))
                  .reduceByKey(Long::sum, 3)
                  .collectAsMap());
      assertEquals(expected, got);
      assertSame(held, bc.value());
      assertEquals(reads + 1, NkBroadcast.reads());

      bc.unpersist();
      assertEquals(sum, sumInTasks(sc, bc));
      assertEquals("reads after unpersist", reads + 2, NkBroadcast.reads());
      assertTrue(nk.exists(path));
    } finally {
      sc.stop();
    }
    assertFalse(path + " left after SparkContext.stop()", nk.exists(path));
    assertFalse(app + " left after SparkContext.stop()", nk.exists(app));
  }

  /**
   * With Spark's own shuffle manager (the broadcasts connect their own client) and the Java
   * serializer: destroy() deletes the File, and the destroyed broadcast then fails on the driver,
   * in a new job, and in a copy shipped before (as a task on an executor has it), each with an
   * error naming it; the broadcast not destroyed is deleted at stop().
   */
  @Test
  public void destroyDeletesTheFileAlsoWithSparksOwnShuffle() throws Exception {
    NodeKernel nk = CLUSTER.client();
    JavaSparkContext sc =
        new JavaSparkContext(
            ShuffleJobTest.conf("local[2]", CLUSTER.cluster())
                .set("spark.shuffle.manager", "sort"));
    String app;
    String keptPath;
    try {
      assertTrue(SparkEnv.get().shuffleManager() instanceof SortShuffleManager);
      app = appDir(sc);
      HashMap<Integer, String> names = new HashMap<>();
      for (int i = 0; i < 50_000; i++) {
        names.put(i, "name-" + i);
      }
      NkBroadcast<HashMap<Integer, String>> destroyed = NkBroadcast.create(sc, names);
      NkBroadcast<HashMap<Integer, String>> kept = NkBroadcast.create(sc, names);
      keptPath = kept.path();
      assertTrue(nk.lookup(destroyed.path()).size() > 0);

      destroyed.unpersist();
      long reads = NkBroadcast.reads();
      List<Integer> keys = range(1000);
      List<String> want = new ArrayList<>();
      for (int k : keys) {
        want.add("name-" + (k * 50));
      }
      assertEquals(
          want, sc.parallelize(keys, TASKS).map(k -> destroyed.value().get(k * 50)).collect());
      assertEquals(reads + 1, NkBroadcast.reads());

      ByteArrayOutputStream shipped = new ByteArrayOutputStream();
      try (ObjectOutputStream out = new ObjectOutputStream(shipped)) {
        out.writeObject(destroyed);
      }
      destroyed.destroy();
      assertFalse(destroyed.path() + " left after destroy()", nk.exists(destroyed.path()));

      SparkException onDriver = assertThrows(SparkException.class, destroyed::value);
      assertTrue(onDriver.toString(), mentions(onDriver, destroyed + " after it was destroyed"));
      Exception inJob =
          assertThrows(
              Exception.class,
              () -> sc.parallelize(keys, TASKS).map(k -> destroyed.value().get(k)).collect());
      assertTrue(inJob.toString(), mentions(inJob, destroyed + " after it was destroyed"));
      NkBroadcast<?> copy;
      try (ObjectInputStream in =
          new ObjectInputStream(new ByteArrayInputStream(shipped.toByteArray()))) {
        copy = (NkBroadcast<?>) in.readObject();
      }
      UncheckedIOException onExecutor = assertThrows(UncheckedIOException.class, copy::value);
      assertTrue(
          onExecutor.getMessage(),
          onExecutor.getMessage().contains(destroyed.path() + " is not in NodeKernel"));

      assertEquals(want, sc.parallelize(keys, TASKS).map(k -> kept.value().get(k * 50)).collect());
      assertTrue(nk.exists(keptPath));
    } finally {
      sc.stop();
    }
    assertFalse(keptPath + " left after SparkContext.stop()", nk.exists(keptPath));
    assertFalse(app + " left after SparkContext.stop()", nk.exists(app));
  }
}

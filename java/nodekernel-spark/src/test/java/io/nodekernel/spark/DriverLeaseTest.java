package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import io.nodekernel.CreateOptions;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeType;
import io.nodekernel.TestCluster;
import java.util.List;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.junit.ClassRule;
import org.junit.Test;
import scala.Tuple2;

/**
 * The driver's lease on its application directory and the sweep that deletes the directories of
 * dead drivers (NkShuffleCleaner's, and each driver's at its first shuffle).
 */
public class DriverLeaseTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  @Test
  public void theTimeoutIsTenMinutesByDefaultAndAtLeastASecond() {
    assertEquals(600_000, new NkShuffleConf(new SparkConf(false)).driverTimeoutMs);
    SparkConf c = new SparkConf(false).set(NkShuffleConf.DRIVER_TIMEOUT, "30s");
    assertEquals(30_000, new NkShuffleConf(c).driverTimeoutMs);
    assertThrows(
        IllegalArgumentException.class,
        () -> new NkShuffleConf(new SparkConf(false).set(NkShuffleConf.DRIVER_TIMEOUT, "10ms")));
  }

  @Test
  public void aLeaseExpiresAfterItsOwnTimeout() {
    byte[] lease = NkDriverLease.value(1_000, 5_000);
    assertFalse(NkDriverLease.expired(lease, 6_000));
    assertTrue(NkDriverLease.expired(lease, 6_001));
    assertFalse("unreadable: left alone", NkDriverLease.expired("x".getBytes(), 1L << 60));
  }

  @Test
  public void theSweepDeletesOnlyDirectoriesWhoseLeaseExpired() throws Exception {
    NodeKernel nk = CLUSTER.client();
    String root = "/lease-sweep";
    long now = 1_000_000;
    for (String app : List.of("dead", "live", "self", "old")) {
      nk.mkdir(root + "/" + app + "/s0", true);
      nk.createContainer(root + "/" + app + "/s0/idx", NodeType.TABLE, CreateOptions.defaults());
      nk.put(root + "/" + app + "/s0/idx/m0", new byte[] {1, 2, 3});
    }
    nk.createContainer(root + "/.drivers", NodeType.TABLE, CreateOptions.defaults());
    nk.put(NkDriverLease.path(root, "dead"), NkDriverLease.value(now - 10_001, 10_000));
    nk.put(NkDriverLease.path(root, "live"), NkDriverLease.value(now - 9_000, 10_000));
    nk.put(NkDriverLease.path(root, "self"), NkDriverLease.value(0, 10_000));
    // "old" has no lease (an earlier version's): left alone.
    assertEquals(List.of("dead"), NkDriverLease.sweep(nk, root, "self", now));
    assertFalse(nk.exists(root + "/dead"));
    assertFalse(nk.exists(NkDriverLease.path(root, "dead")));
    for (String kept : List.of("live", "self", "old")) {
      assertTrue(kept, nk.exists(root + "/" + kept));
    }
    assertTrue(nk.exists(NkDriverLease.path(root, "live")));
    assertTrue(nk.exists(NkDriverLease.path(root, "self")));
    assertEquals(List.of(), NkDriverLease.sweep(nk, "/no-such-root", null, now));
    nk.delete(root, true);
  }

  /** A driver sweeps the root when it registers its first shuffle: a dead driver's data goes. */
  @Test
  public void theNextDriverSweepsADeadDriversDirectory() throws Exception {
    NodeKernel nk = CLUSTER.client();
    String root = NkShuffleConf.DEFAULT_ROOT;
    nk.mkdir(root + "/app-dead/s0", true);
    nk.createContainer(root + "/.drivers", NodeType.TABLE, CreateOptions.defaults());
    long now = System.currentTimeMillis();
    nk.put(NkDriverLease.path(root, "app-dead"), NkDriverLease.value(now - 60_000, 10_000));
    JavaSparkContext sc = new JavaSparkContext(ShuffleJobTest.conf("local[2]", CLUSTER.cluster()));
    try {
      assertEquals(
          2L,
          sc.parallelizePairs(List.of(new Tuple2<>(1, 1), new Tuple2<>(2, 2), new Tuple2<>(1, 3)))
              .reduceByKey(Integer::sum)
              .count());
      // The sweep runs in the background: bounded only to catch a hang.
      long deadline = System.nanoTime() + 120_000_000_000L;
      while (nk.exists(root + "/app-dead") && System.nanoTime() < deadline) {
        Thread.sleep(50);
      }
      assertFalse(nk.exists(root + "/app-dead"));
      assertFalse(nk.exists(NkDriverLease.path(root, "app-dead")));
      assertTrue(nk.exists(NkDriverLease.path(root, sc.sc().applicationId())));
    } finally {
      sc.stop();
    }
  }
}

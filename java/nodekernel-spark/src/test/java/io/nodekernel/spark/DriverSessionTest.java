package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import io.nodekernel.CreateOptions;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeType;
import io.nodekernel.TestCluster;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.junit.ClassRule;
import org.junit.Test;

/**
 * The driver's session, which its application's directory is bound to: a driver killed without
 * {@code stop()} loses the directory once the lease lapses, with no cleaner. And NkShuffleCleaner,
 * which still deletes the directories of dead drivers of earlier versions (their {@code .drivers}
 * leases).
 */
public class DriverSessionTest {
  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  /** The driver timeout of the killed driver: short, yet long for a stalled 2-core machine. */
  private static final long TIMEOUT_MS = 3000;

  @Test
  public void theTimeoutIsTenMinutesByDefaultAndAtLeastASecond() {
    assertEquals(600_000, new NkShuffleConf(new SparkConf(false)).driverTimeoutMs);
    SparkConf c = new SparkConf(false).set(NkShuffleConf.DRIVER_TIMEOUT, "30s");
    assertEquals(30_000, new NkShuffleConf(c).driverTimeoutMs);
    assertThrows(
        IllegalArgumentException.class,
        () -> new NkShuffleConf(new SparkConf(false).set(NkShuffleConf.DRIVER_TIMEOUT, "10ms")));
  }

  /**
   * kill -9 of a driver JVM in the middle of a job (its reduce tasks paused, its map outputs and a
   * broadcast written): its application's directory stays while it lives, and goes once its
   * session's lease lapses; the rest of the namespace stays.
   */
  @Test
  public void aKilledDriversDirectoryGoesWithItsSession() throws Exception {
    NodeKernel nk = CLUSTER.client();
    nk.mkdir(NkShuffleConf.DEFAULT_ROOT + "/other-data", true);
    List<String> cmd = new ArrayList<>();
    cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    // The flags Spark needs on Java 17, as this JVM got them (the build's argLine).
    cmd.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments());
    cmd.add("-cp");
    cmd.add(System.getProperty("surefire.test.class.path", System.getProperty("java.class.path")));
    cmd.add(KilledDriver.class.getName());
    cmd.add(CLUSTER.cluster().meta());
    cmd.add(CLUSTER.cluster().clientConfig());
    cmd.add(TIMEOUT_MS + "ms");
    File log = Files.createTempFile("nk-killed-driver", ".log").toFile();
    Process driver = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.to(log)).start();
    String app = null;
    try {
      BufferedReader out =
          new BufferedReader(
              new InputStreamReader(driver.getInputStream(), StandardCharsets.UTF_8));
      for (String line; (line = out.readLine()) != null && !line.equals("ready"); ) {
        if (line.startsWith("app ")) {
          app = line.substring(4);
        }
      }
      assertTrue(
          "the driver did not start its reduce tasks; its log:\n" + Files.readString(log.toPath()),
          driver.isAlive() && app != null);
      String dir = NkShuffleConf.DEFAULT_ROOT + "/" + app;
      assertFalse("map outputs written", nk.list(dir + "/s0/idx").isEmpty());
      assertTrue("the broadcast written", nk.exists(dir + "/b0"));
      // Renewed while the driver lives: more than a lease passes and it stays.
      Thread.sleep(TIMEOUT_MS + 1000);
      assertTrue(nk.exists(dir + "/s0/idx"));
    } finally {
      driver.destroyForcibly(); // SIGKILL
      assertTrue(driver.waitFor(TestCluster.HANG_SECONDS, TimeUnit.SECONDS));
      Files.deleteIfExists(log.toPath());
    }
    String dir = NkShuffleConf.DEFAULT_ROOT + "/" + app;
    // Removed by the metadata server once the lease lapses; bounded only to catch a hang.
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TestCluster.HANG_SECONDS);
    while (nk.exists(dir)) {
      assertTrue(dir + " stayed after its driver was killed", System.nanoTime() < deadline);
      Thread.sleep(50);
    }
    assertTrue(nk.exists(NkShuffleConf.DEFAULT_ROOT + "/other-data"));
    assertFalse(
        "no lease KeyValue",
        nk.exists(NkShuffleCleaner.leasePath(NkShuffleConf.DEFAULT_ROOT, app)));
  }

  /** A lease as an earlier version's driver put it. */
  private static byte[] oldLease(long renewedAtMs, long timeoutMs) {
    return (renewedAtMs + " " + timeoutMs + " host 1234").getBytes(StandardCharsets.UTF_8);
  }

  @Test
  public void anOldLeaseExpiresAfterItsOwnTimeout() {
    byte[] lease = oldLease(1_000, 5_000);
    assertFalse(NkShuffleCleaner.expired(lease, 6_000));
    assertTrue(NkShuffleCleaner.expired(lease, 6_001));
    assertFalse("unreadable: left alone", NkShuffleCleaner.expired("x".getBytes(), 1L << 60));
  }

  @Test
  public void theCleanerDeletesOnlyDirectoriesWhoseOldLeaseExpired() throws Exception {
    NodeKernel nk = CLUSTER.client();
    String root = "/lease-sweep";
    long now = 1_000_000;
    for (String app : List.of("dead", "live", "new")) {
      nk.mkdir(root + "/" + app + "/s0", true);
      nk.createContainer(root + "/" + app + "/s0/idx", NodeType.TABLE, CreateOptions.defaults());
      nk.put(root + "/" + app + "/s0/idx/m0", new byte[] {1, 2, 3});
    }
    nk.createContainer(root + "/.drivers", NodeType.TABLE, CreateOptions.defaults());
    nk.put(NkShuffleCleaner.leasePath(root, "dead"), oldLease(now - 10_001, 10_000));
    nk.put(NkShuffleCleaner.leasePath(root, "live"), oldLease(now - 9_000, 10_000));
    // "new" has no lease (this version's, bound to its driver's session): left alone.
    assertEquals(List.of("dead"), NkShuffleCleaner.sweep(nk, root, now));
    assertFalse(nk.exists(root + "/dead"));
    assertFalse(nk.exists(NkShuffleCleaner.leasePath(root, "dead")));
    for (String kept : List.of("live", "new")) {
      assertTrue(kept, nk.exists(root + "/" + kept));
    }
    assertTrue(nk.exists(NkShuffleCleaner.leasePath(root, "live")));
    assertEquals(List.of(), NkShuffleCleaner.sweep(nk, "/no-such-root", now));
    nk.delete(root, true);
  }
}

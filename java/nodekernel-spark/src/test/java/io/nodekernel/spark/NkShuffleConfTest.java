package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import org.apache.spark.SparkConf;
import org.junit.Test;

/** The shuffle's settings are checked when the manager is made, before any job runs. */
public class NkShuffleConfTest {
  private static NkShuffleConf conf(String key, String value) {
    return new NkShuffleConf(new SparkConf(false).set(key, value));
  }

  @Test
  public void theRootIsAnAbsolutePathWithoutTrailingSlashes() {
    assertEquals("/spark-shuffle/app-1", new NkShuffleConf(new SparkConf(false)).appDir("app-1"));
    assertEquals("/app-1", conf(NkShuffleConf.ROOT, "/").appDir("app-1"));
    assertEquals("/tmp/s/app-1", conf(NkShuffleConf.ROOT, "/tmp/s//").appDir("app-1"));
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> conf(NkShuffleConf.ROOT, "tmp/s"));
    assertTrue(e.getMessage(), e.getMessage().contains(NkShuffleConf.ROOT));
  }

  @Test
  public void readsInFlightMustNotBeNegative() {
    assertThrows(IllegalArgumentException.class, () -> conf(NkShuffleConf.READS_IN_FLIGHT, "-1"));
  }

  /** Settings the NodeKernel shuffle cannot honour are refused, not silently ignored. */
  @Test
  public void unsupportedSparkShuffleFeaturesAreRefused() {
    for (String key :
        new String[] {
          "spark.shuffle.useOldFetchProtocol",
          "spark.shuffle.push.enabled",
          "spark.storage.decommission.shuffleBlocks.enabled"
        }) {
      IllegalArgumentException e =
          assertThrows(
              IllegalArgumentException.class,
              () -> new NodeKernelShuffleManager(new SparkConf(false).set(key, "true"), true));
      assertTrue(e.getMessage(), e.getMessage().contains(key));
    }
  }
}

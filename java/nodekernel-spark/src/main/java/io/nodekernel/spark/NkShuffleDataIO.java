package io.nodekernel.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.shuffle.api.ShuffleDataIO;
import org.apache.spark.shuffle.api.ShuffleDriverComponents;
import org.apache.spark.shuffle.api.ShuffleExecutorComponents;
import org.apache.spark.shuffle.sort.io.LocalDiskShuffleDataIO;
import org.apache.spark.shuffle.sort.io.LocalDiskShuffleDriverComponents;

/**
 * Tells Spark's driver that shuffle data outlives executors ({@code supportsReliableStorage}): when
 * an executor is lost, the scheduler keeps its map outputs, which stay readable in NodeKernel,
 * instead of running their map tasks again. The NodeKernel shuffle manager sets it as {@code
 * spark.shuffle.sort.io.plugin.class} unless another plugin is configured.
 *
 * <p>Everything else is Spark's local-disk plugin: removing a shuffle still tells every block
 * manager, which is how the NodeKernel shuffle manager hears to delete the shuffle's data.
 */
public final class NkShuffleDataIO implements ShuffleDataIO {
  /** Spark's key for the shuffle I/O plugin. */
  public static final String PLUGIN = "spark.shuffle.sort.io.plugin.class";

  private final LocalDiskShuffleDataIO local;

  public NkShuffleDataIO(SparkConf conf) {
    this.local = new LocalDiskShuffleDataIO(conf);
  }

  @Override
  public ShuffleExecutorComponents executor() {
    return local.executor();
  }

  @Override
  public ShuffleDriverComponents driver() {
    return new LocalDiskShuffleDriverComponents() {
      @Override
      public boolean supportsReliableStorage() {
        return true;
      }
    };
  }
}

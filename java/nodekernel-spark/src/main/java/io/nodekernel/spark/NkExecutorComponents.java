package io.nodekernel.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.api.ShuffleExecutorComponents;
import org.apache.spark.shuffle.api.ShuffleMapOutputWriter;
import org.apache.spark.shuffle.api.SingleSpillShuffleMapOutputWriter;

/**
 * The plugin face Spark's own writers ({@code SortShuffleWriter}, {@code UnsafeShuffleWriter})
 * write through, and {@link NkDirectWriter}'s map output: one per map task, so the task's output
 * can be aborted when it fails.
 */
final class NkExecutorComponents implements ShuffleExecutorComponents {
  private final NodeKernelShuffleManager manager;
  private final ShuffleWriteMetricsReporter metrics;
  private final List<NkMapOutputWriter> writers = new ArrayList<>();

  NkExecutorComponents(NodeKernelShuffleManager manager, ShuffleWriteMetricsReporter metrics) {
    this.manager = manager;
    this.metrics = metrics;
  }

  @Override
  public void initializeExecutor(String appId, String execId, Map<String, String> extraConfigs) {}

  @Override
  public ShuffleMapOutputWriter createMapOutputWriter(
      int shuffleId, long mapTaskId, int numPartitions) {
    return writer(shuffleId, mapTaskId, numPartitions, false);
  }

  /** A map output; {@code direct}: for a writer that has every partition's segment open. */
  synchronized NkMapOutputWriter writer(
      int shuffleId, long mapTaskId, int numPartitions, boolean direct) {
    NkMapOutputWriter w =
        new NkMapOutputWriter(manager, shuffleId, mapTaskId, numPartitions, metrics, direct);
    writers.add(w);
    return w;
  }

  /**
   * Where {@code UnsafeShuffleWriter} puts a map output that spilled once: the spill file already
   * holds the partitions in order, so each is copied to its segment as it is. Spark counts those
   * bytes as written when it writes the spill; its merge path would count them a second time.
   */
  @Override
  public Optional<SingleSpillShuffleMapOutputWriter> createSingleFileMapOutputWriter(
      int shuffleId, long mapTaskId) {
    return Optional.of(
        (spill, lengths, checksums) -> {
          NkMapOutputWriter w = writer(shuffleId, mapTaskId, lengths.length, false);
          w.copySpill(spill, lengths);
          w.commitAllPartitions(checksums);
        });
  }

  /** Aborts every map output not committed (a committed one is left alone). */
  synchronized void abortAll(Throwable error) {
    for (NkMapOutputWriter w : writers) {
      w.abort(error);
    }
  }
}

package io.nodekernel.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.api.ShuffleExecutorComponents;
import org.apache.spark.shuffle.api.ShuffleMapOutputWriter;

/**
 * The plugin face Spark's own writers ({@code SortShuffleWriter}, {@code UnsafeShuffleWriter})
 * write through: one per map task, so the task's output can be aborted when it fails.
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
  public synchronized ShuffleMapOutputWriter createMapOutputWriter(
      int shuffleId, long mapTaskId, int numPartitions) {
    NkMapOutputWriter w =
        new NkMapOutputWriter(manager, shuffleId, mapTaskId, numPartitions, metrics);
    writers.add(w);
    return w;
  }

  /** Aborts every map output not committed (a committed one is left alone). */
  synchronized void abortAll(Throwable error) {
    for (NkMapOutputWriter w : writers) {
      w.abort(error);
    }
  }
}

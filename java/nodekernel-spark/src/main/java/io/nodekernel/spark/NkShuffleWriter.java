package io.nodekernel.spark;

import java.io.IOException;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.shuffle.ShuffleWriter;
import scala.Option;
import scala.Product2;
import scala.collection.Iterator;

/**
 * Spark's writer, plus an abort of the map output when the task fails: {@code
 * SortShuffleWriter.stop(false)} never aborts its {@code ShuffleMapOutputWriter}.
 */
final class NkShuffleWriter<K, V> extends ShuffleWriter<K, V> {
  private final ShuffleWriter<K, V> inner;
  private final NkExecutorComponents components;

  NkShuffleWriter(ShuffleWriter<K, V> inner, NkExecutorComponents components) {
    this.inner = inner;
    this.components = components;
  }

  @Override
  public void write(Iterator<Product2<K, V>> records) throws IOException {
    inner.write(records);
  }

  @Override
  public Option<MapStatus> stop(boolean success) {
    try {
      return inner.stop(success);
    } finally {
      if (!success) {
        components.abortAll(null);
      }
    }
  }

  @Override
  public long[] getPartitionLengths() {
    return inner.getPartitionLengths();
  }
}

package io.nodekernel.spark;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.spark.SparkContext;
import org.apache.spark.executor.ShuffleReadMetrics;
import org.apache.spark.executor.ShuffleWriteMetrics;
import org.apache.spark.executor.TaskMetrics;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerTaskEnd;

/** The shuffle metrics of every task that ends while it listens, summed as the UI sums them. */
final class ShuffleMetrics extends SparkListener implements AutoCloseable {
  private final SparkContext sc;
  long bytesWritten;
  long recordsWritten;
  long writeTimeNanos;
  long bytesRead;
  long localBytesRead;
  long recordsRead;
  long blocksFetched;
  long fetchWaitMillis;
  long diskBytesSpilled;

  private ShuffleMetrics(SparkContext sc) {
    this.sc = sc;
  }

  /** Listens to {@code sc} until {@link #close()}. */
  static ShuffleMetrics listen(SparkContext sc) {
    ShuffleMetrics m = new ShuffleMetrics(sc);
    sc.addSparkListener(m);
    return m;
  }

  @Override
  public synchronized void onTaskEnd(SparkListenerTaskEnd end) {
    TaskMetrics t = end.taskMetrics();
    if (t == null) {
      return;
    }
    diskBytesSpilled += t.diskBytesSpilled();
    ShuffleWriteMetrics w = t.shuffleWriteMetrics();
    bytesWritten += w.bytesWritten();
    recordsWritten += w.recordsWritten();
    writeTimeNanos += w.writeTime();
    ShuffleReadMetrics r = t.shuffleReadMetrics();
    bytesRead += r.totalBytesRead();
    localBytesRead += r.localBytesRead();
    recordsRead += r.recordsRead();
    blocksFetched += r.totalBlocksFetched();
    fetchWaitMillis += r.fetchWaitTime();
  }

  /** Waits until the listeners have seen every event posted so far (a timeout only for hangs). */
  static void drain(SparkContext sc) {
    try {
      sc.listenerBus().waitUntilEmpty(TimeUnit.MINUTES.toMillis(5));
    } catch (TimeoutException e) {
      throw new AssertionError("Spark's listener bus did not drain", e);
    }
  }

  /** Waits for the events already posted, then stops listening. */
  @Override
  public void close() {
    drain(sc);
    sc.removeSparkListener(this);
  }
}

package io.nodekernel.spark;

import io.nodekernel.FileRange;
import io.nodekernel.NkInputStream;
import io.nodekernel.NodeKernelException;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import org.apache.spark.Aggregator;
import org.apache.spark.InterruptibleIterator;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.FetchFailedException;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleBlockId;
import org.apache.spark.util.CompletionIterator$;
import org.apache.spark.util.TaskCompletionListener;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Function0;
import scala.Option;
import scala.Product2;
import scala.Tuple2;
import scala.Tuple3;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.collection.Seq;
import scala.runtime.BoxedUnit;

/**
 * Reads partitions {@code [startPartition, endPartition)} of the map outputs {@code [startMapIndex,
 * endMapIndex)}: exactly the map attempts the tracker lists (so failed and speculative losers are
 * never read), as one NodeKernel multistream over their segments, then Spark's {@code
 * BlockStoreShuffleReader} pipeline (deserialize, aggregate, sort).
 */
final class NkShuffleReader<K, C> implements ShuffleReader<K, C> {
  private final NodeKernelShuffleManager manager;
  private final BaseShuffleHandle<K, ?, C> handle;
  private final int startMapIndex;
  private final int endMapIndex;
  private final int startPartition;
  private final int endPartition;
  private final TaskContext ctx;
  private final ShuffleReadMetricsReporter metrics;

  /** One (map, partition) segment. */
  private record Segment(
      BlockManagerId location,
      ShuffleBlockId block,
      int mapIndex,
      String path,
      long offset,
      long length,
      boolean local) {}

  NkShuffleReader(
      NodeKernelShuffleManager manager,
      BaseShuffleHandle<K, ?, C> handle,
      int startMapIndex,
      int endMapIndex,
      int startPartition,
      int endPartition,
      TaskContext ctx,
      ShuffleReadMetricsReporter metrics) {
    this.manager = manager;
    this.handle = handle;
    this.startMapIndex = startMapIndex;
    this.endMapIndex = endMapIndex;
    this.startPartition = startPartition;
    this.endPartition = endPartition;
    this.ctx = ctx;
    this.metrics = metrics;
  }

  /** Throws a checked exception through Scala's iterator interfaces. */
  @SuppressWarnings("unchecked")
  private static <T extends Throwable> RuntimeException sneaky(Throwable t) throws T {
    throw (T) t;
  }

  private FetchFailedException fetchFailed(Segment s, String what, Throwable cause) {
    return new FetchFailedException(
        s.location,
        handle.shuffleId(),
        s.block.mapId(),
        s.mapIndex,
        s.block.reduceId(),
        what + " " + s.block.name() + " (" + s.path + " at " + s.offset + ", " + s.length + ")",
        cause);
  }

  private List<Segment> segments() {
    int shuffleId = handle.shuffleId();
    String dir = manager.shuffleDir(shuffleId);
    String here = manager.location();
    Iterator<Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>>> byLocation =
        SparkEnv.get()
            .mapOutputTracker()
            .getMapSizesByExecutorId(
                shuffleId, startMapIndex, endMapIndex, startPartition, endPartition);
    // The blocks to read, not yet located in NodeKernel (path, offset and length unknown).
    List<Segment> blocks = new ArrayList<>();
    while (byLocation.hasNext()) {
      Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>> t = byLocation.next();
      Iterator<Tuple3<BlockId, Object, Object>> it = t._2().iterator();
      while (it.hasNext()) {
        Tuple3<BlockId, Object, Object> b = it.next();
        if (!(b._1() instanceof ShuffleBlockId id)) {
          throw new IllegalStateException("unexpected shuffle block " + b._1());
        }
        blocks.add(new Segment(t._1(), id, (Integer) b._3(), dir, 0, 0, false));
      }
    }
    if (blocks.isEmpty()) {
      return blocks;
    }
    List<Long> mapIds = new ArrayList<>(blocks.size());
    for (Segment b : blocks) {
      mapIds.add(b.block.mapId());
    }
    Map<Long, MapIndex> indexes;
    try {
      indexes = manager.indexes(shuffleId, mapIds);
    } catch (IOException e) {
      throw sneaky(fetchFailed(blocks.get(0), "cannot fetch the map indexes for", e));
    }
    List<Segment> segments = new ArrayList<>(blocks.size());
    for (Segment b : blocks) {
      MapIndex index = indexes.get(b.block.mapId());
      if (index == null) {
        throw sneaky(fetchFailed(b, "no map index for", null));
      }
      int reduceId = b.block.reduceId();
      int i = index.find(reduceId);
      if (i < 0) {
        throw sneaky(fetchFailed(b, "map index has no segment for", null));
      }
      segments.add(
          new Segment(
              b.location,
              b.block,
              b.mapIndex,
              index.file(dir, reduceId),
              index.offset(i),
              index.length(i),
              here.equals(index.host)));
    }
    return segments;
  }

  @Override
  public Iterator<Product2<K, C>> read() {
    long t0 = System.nanoTime();
    List<Segment> segments = segments();
    NkInputStream stream = null;
    if (!segments.isEmpty()) {
      List<FileRange> ranges = new ArrayList<>(segments.size());
      for (Segment s : segments) {
        ranges.add(new FileRange(s.path, s.offset, s.length));
      }
      try {
        stream = manager.client().openRanges(ranges, manager.readsInFlight());
      } catch (IOException e) {
        // The segment the failure is about (a missing File, or one shorter than its index says).
        int i = e instanceof NodeKernelException nke ? nke.range() : -1;
        throw sneaky(fetchFailed(segments.get(Math.max(i, 0)), "cannot read", e));
      }
    }
    metrics.incFetchWaitTime((System.nanoTime() - t0) / 1_000_000);
    NkInputStream opened = stream;
    if (opened != null) {
      ctx.addTaskCompletionListener((TaskCompletionListener) c -> opened.close());
    }
    FetchTimer in = opened == null ? null : new FetchTimer(opened);

    @SuppressWarnings("unchecked")
    ShuffleDependency<Object, Object, Object> dep =
        (ShuffleDependency<Object, Object, Object>)
            (ShuffleDependency<?, ?, ?>) handle.dependency();
    Records records = new Records(segments, in, dep.serializer().newInstance());
    Iterator<Product2<Object, Object>> it = records;
    Function0<BoxedUnit> done =
        () -> {
          if (in != null) {
            in.close();
          }
          ctx.taskMetrics().mergeShuffleReadMetrics();
          return BoxedUnit.UNIT;
        };
    it = CompletionIterator$.MODULE$.apply(it, done);
    it = new InterruptibleIterator<>(ctx, it);
    Option<Aggregator<Object, Object, Object>> aggregator = dep.aggregator();
    if (aggregator.isDefined()) {
      it =
          products(
              dep.mapSideCombine()
                  ? aggregator.get().combineCombinersByKey(it, ctx)
                  : aggregator.get().combineValuesByKey(it, ctx));
    }
    if (dep.keyOrdering().isDefined()) {
      ExternalSorter<Object, Object, Object> sorter =
          new ExternalSorter<>(
              ctx, Option.empty(), Option.empty(), dep.keyOrdering(), dep.serializer());
      it = sorter.insertAllAndUpdateMetrics(it);
    }
    if (!(it instanceof InterruptibleIterator)) {
      it = new InterruptibleIterator<>(ctx, it);
    }
    @SuppressWarnings("unchecked")
    Iterator<Product2<K, C>> result = (Iterator<Product2<K, C>>) (Iterator<?>) it;
    return result;
  }

  @SuppressWarnings("unchecked")
  private static Iterator<Product2<Object, Object>> products(Iterator<?> it) {
    return (Iterator<Product2<Object, Object>>) it;
  }

  /**
   * The reducer's multistream, with the time its reads wait for NodeKernel reported as the fetch
   * wait time (in whole milliseconds as they accumulate; the rest when it closes).
   */
  private final class FetchTimer extends InputStream {
    private final NkInputStream in;
    private long nanos;

    FetchTimer(NkInputStream in) {
      this.in = in;
    }

    private void waited(long t0) {
      nanos += System.nanoTime() - t0;
      if (nanos >= 1_000_000) {
        metrics.incFetchWaitTime(nanos / 1_000_000);
        nanos %= 1_000_000;
      }
    }

    @Override
    public int read() throws IOException {
      long t0 = System.nanoTime();
      int b = in.read();
      waited(t0);
      return b;
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
      long t0 = System.nanoTime();
      int n = in.read(b, off, len);
      waited(t0);
      return n;
    }

    @Override
    public long skip(long n) throws IOException {
      long t0 = System.nanoTime();
      long skipped = in.skip(n);
      waited(t0);
      return skipped;
    }

    @Override
    public int available() throws IOException {
      return in.available();
    }

    @Override
    public void close() {
      if (nanos > 0) {
        metrics.incFetchWaitTime((nanos + 999_999) / 1_000_000);
        nanos = 0;
      }
      in.close();
    }
  }

  /**
   * The records of the segments in turn, each segment its own (compressed) stream. A Scala iterator
   * itself: {@code AbstractIterator} is the same on Scala 2.12 and 2.13, where the converters from
   * Java iterators are not ({@code scala.jdk.javaapi.CollectionConverters} is 2.13's only).
   */
  private final class Records extends AbstractIterator<Product2<Object, Object>> {
    private final List<Segment> segments;
    private final InputStream in;
    private final SerializerInstance serializer;
    private final SerializerManager serializerManager = SparkEnv.get().serializerManager();
    private int next;
    private Segment current;
    private BoundedInput bounded;
    private DeserializationStream records;
    private Iterator<Tuple2<Object, Object>> it;

    Records(List<Segment> segments, InputStream in, SerializerInstance serializer) {
      this.segments = segments;
      this.in = in;
      this.serializer = serializer;
    }

    @Override
    public boolean hasNext() {
      try {
        while (it == null || !it.hasNext()) {
          endSegment();
          if (next == segments.size()) {
            return false;
          }
          current = segments.get(next++);
          bounded = new BoundedInput(in, current.length);
          if (current.local) {
            metrics.incLocalBlocksFetched(1);
            metrics.incLocalBytesRead(current.length);
          } else {
            metrics.incRemoteBlocksFetched(1);
            metrics.incRemoteBytesRead(current.length);
          }
          records =
              serializer.deserializeStream(serializerManager.wrapStream(current.block, bounded));
          it = records.asKeyValueIterator();
        }
        return true;
      } catch (Exception e) {
        throw failure(e);
      }
    }

    private void endSegment() throws IOException {
      if (records != null) {
        records.close();
        records = null;
      }
      if (bounded != null) {
        bounded.close();
        bounded = null;
      }
    }

    /**
     * A read error of the current segment becomes its FetchFailed, also where the deserializer
     * wrapped it (Kryo's {@code KryoException} around a {@code DataLost} of the segment's block on
     * a dead storage server): else the task fails as a task, and Spark retries it against the same
     * lost block until the job aborts instead of running the map again.
     */
    private RuntimeException failure(Exception e) {
      if (current != null) {
        for (Throwable t = e; t != null; t = t.getCause()) {
          if (t instanceof IOException) {
            return sneaky(fetchFailed(current, "cannot read", e));
          }
        }
      }
      return sneaky(e);
    }

    @Override
    public Product2<Object, Object> next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      Tuple2<Object, Object> r;
      try {
        r = it.next();
      } catch (Exception e) {
        throw failure(e);
      }
      metrics.incRecordsRead(1);
      return r;
    }
  }
}

package io.nodekernel.spark;

import java.io.IOException;
import org.apache.spark.Partitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.scheduler.MapStatus$;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.shuffle.api.ShufflePartitionWriter;
import org.apache.spark.storage.ShuffleBlockId;
import scala.Option;
import scala.Product2;
import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * The map side where Spark would take its bypass-merge writer (no map-side combine, at most {@code
 * spark.shuffle.sort.bypassMergeThreshold} reduce partitions): each record is serialized straight
 * into its partition's segment, with every partition's segment open at once (in the slot's File of
 * that partition, so each File still has one writer). Nothing is sorted and nothing goes to local
 * disk; Spark's bypass writer writes a local file per partition and then copies them all.
 *
 * <p>Segments are compressed and encrypted per partition as Spark's writers do ({@code
 * SerializerManager.wrapStream}), so the reader cannot tell which writer wrote them.
 */
final class NkDirectWriter<K, V> extends ShuffleWriter<K, V> {
  private final BaseShuffleHandle<K, V, ?> handle;
  private final long mapId;
  private final ShuffleWriteMetricsReporter metrics;
  private final NkExecutorComponents components;
  private long[] lengths = new long[0];
  private MapStatus status;
  private boolean stopped;

  NkDirectWriter(
      BaseShuffleHandle<K, V, ?> handle,
      long mapId,
      ShuffleWriteMetricsReporter metrics,
      NkExecutorComponents components) {
    this.handle = handle;
    this.mapId = mapId;
    this.metrics = metrics;
    this.components = components;
  }

  @SuppressWarnings("unchecked")
  private static <T> ClassTag<T> any() {
    return (ClassTag<T>) ClassTag$.MODULE$.Any();
  }

  @Override
  public void write(Iterator<Product2<K, V>> records) throws IOException {
    ShuffleDependency<K, V, ?> dep = handle.dependency();
    Partitioner partitioner = dep.partitioner();
    int n = partitioner.numPartitions();
    int shuffleId = handle.shuffleId();
    NkMapOutputWriter output = components.writer(shuffleId, mapId, n, true);
    ShufflePartitionWriter[] partitions = new ShufflePartitionWriter[n];
    for (int p = 0; p < n; p++) {
      partitions[p] = output.getPartitionWriter(p);
    }
    SerializerInstance serializer = dep.serializer().newInstance();
    SerializerManager serializerManager = SparkEnv.get().serializerManager();
    // A partition's stream is made at its first record: a partition without records has no
    // segment.
    SerializationStream[] streams = new SerializationStream[n];
    ClassTag<K> keyTag = any();
    ClassTag<V> valueTag = any();
    while (records.hasNext()) {
      Product2<K, V> record = records.next();
      K key = record._1();
      int p = partitioner.getPartition(key);
      SerializationStream s = streams[p];
      if (s == null) {
        s =
            serializer.serializeStream(
                serializerManager.wrapStream(
                    new ShuffleBlockId(shuffleId, mapId, p), partitions[p].openStream()));
        streams[p] = s;
      }
      s.writeKey(key, keyTag);
      s.writeValue(record._2(), valueTag);
      metrics.incRecordsWritten(1);
    }
    long[] lens = new long[n];
    long bytes = 0;
    for (int p = 0; p < n; p++) {
      if (streams[p] != null) {
        streams[p].close(); // publishes the segment
        lens[p] = partitions[p].getNumBytesWritten();
        bytes += lens[p];
      }
    }
    metrics.incBytesWritten(bytes);
    output.commitAllPartitions(new long[0]);
    lengths = lens;
    status = MapStatus$.MODULE$.apply(SparkEnv.get().blockManager().shuffleServerId(), lens, mapId);
  }

  @Override
  public Option<MapStatus> stop(boolean success) {
    if (stopped) {
      return Option.empty();
    }
    stopped = true;
    if (!success) {
      components.abortAll(null);
      return Option.empty();
    }
    if (status == null) {
      throw new IllegalStateException(
          "map task " + mapId + " stopped before its output was written");
    }
    return Option.apply(status);
  }

  @Override
  public long[] getPartitionLengths() {
    return lengths;
  }
}

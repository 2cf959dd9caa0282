package io.nodekernel.spark;

import io.nodekernel.CreateOptions;
import io.nodekernel.NkOutputStream;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeType;
import io.nodekernel.Session;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.SparkException;
import org.apache.spark.TaskContext;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.shuffle.ShuffleHandle;
import org.apache.spark.shuffle.ShuffleManager;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.shuffle.sort.SerializedShuffleHandle;
import org.apache.spark.shuffle.sort.SortShuffleManager;
import org.apache.spark.shuffle.sort.SortShuffleWriter;
import org.apache.spark.shuffle.sort.UnsafeShuffleWriter;
import org.apache.spark.util.TaskCompletionListener;

/**
 * A Spark shuffle manager that keeps shuffle data in NodeKernel instead of executors' local disks:
 * {@code spark.shuffle.manager=io.nodekernel.spark.NodeKernelShuffleManager}. The same sources are
 * built for Spark 3.5 (Scala 2.12 and 2.13) and 4.0, a jar each; the constructor refuses a jar
 * built for another Scala version or Spark line ({@link SparkLine}).
 *
 * <p>Map tasks write through Spark's own sort-based writers (sorting, map-side combine, spills,
 * serialization, compression and encryption stay Spark's), or, where Spark would take its
 * bypass-merge writer, through {@link NkDirectWriter}, straight into NodeKernel; reducers read the
 * segments the map output tracker lists straight from NodeKernel. Layout, under {@code
 * <root>/<appId>}:
 *
 * <pre>
 * s&lt;shuffleId&gt;/p&lt;reduceId&gt;/e&lt;execId&gt;-t&lt;slot&gt;  File (in a Bag per reduce partition, made by its first writer): segments of the slot's map tasks
 * s&lt;shuffleId&gt;/idx/m&lt;mapTaskId&gt;               KeyValue (in a Table): a map attempt's index, its commit marker
 * </pre>
 *
 * <p>The driver creates {@code <root>/<appId>} bound to a session of its own ({@link Session},
 * lease {@link NkShuffleConf#DRIVER_TIMEOUT}): {@link #stop()} deletes it and closes the session,
 * and if the driver dies without {@code stop()}, the metadata server removes the directory once the
 * session's lease lapses.
 */
public class NodeKernelShuffleManager implements ShuffleManager {
  private final SparkConf sparkConf;
  private final boolean isDriver;
  private final NkShuffleConf conf;
  private final SlotPool slots = new SlotPool();
  private final NkShuffleBlockResolver resolver = new NkShuffleBlockResolver();
  private final Map<Integer, Map<Long, MapIndex>> indexes = new ConcurrentHashMap<>();

  /** Map tasks this JVM ran, by the writer that wrote their output. */
  private final Map<String, LongAdder> writers = new ConcurrentHashMap<>();

  /** Partition writers opened as channels (Spark's transferTo merge of spills). */
  private final LongAdder channels = new LongAdder();

  private NodeKernel client;
  private boolean stopped;

  /**
   * On the driver: the session the application's directory is bound to, opened when the directory
   * is first needed (a shuffle or an NkBroadcast); guarded by this.
   */
  private Session session;

  public NodeKernelShuffleManager(SparkConf sparkConf, boolean isDriver) {
    SparkLine.check();
    for (String key :
        new String[] {
          "spark.shuffle.useOldFetchProtocol",
          "spark.shuffle.push.enabled",
          "spark.storage.decommission.shuffleBlocks.enabled"
        }) {
      if (sparkConf.getBoolean(key, false)) {
        throw new IllegalArgumentException(
            key + "=true is not supported by " + getClass().getSimpleName());
      }
    }
    this.sparkConf = sparkConf;
    this.isDriver = isDriver;
    this.conf = new NkShuffleConf(sparkConf);
    // The SparkContext reads the plugin from this same conf after creating the shuffle manager.
    if (isDriver) {
      sparkConf.setIfMissing(NkShuffleDataIO.PLUGIN, NkShuffleDataIO.class.getName());
    }
  }

  /** This JVM's client, connected at first use. */
  synchronized NodeKernel client() throws IOException {
    if (stopped) {
      throw new IOException("the NodeKernel shuffle manager is stopped");
    }
    if (client == null) {
      client = NodeKernel.connect(conf.meta, conf.config);
    }
    return client;
  }

  SlotPool slots() {
    return slots;
  }

  int readsInFlight() {
    return conf.readsInFlight;
  }

  String executorId() {
    return SparkEnv.get().executorId();
  }

  /**
   * Where this executor's map output is placed, as its client counts it ({@code [client] location},
   * else the host name). Without a client (it cannot connect), the host name: the call that needs
   * the client next fails with the reason.
   */
  String location() {
    try {
      return client().location();
    } catch (IOException e) {
      return NodeKernel.localLocation();
    }
  }

  /** This application's directory. */
  String appDir() {
    return conf.appDir(sparkConf.getAppId());
  }

  /**
   * On the driver, makes the application's directory bound to the driver's session, opening the
   * session first (with a lease of {@link NkShuffleConf#DRIVER_TIMEOUT}), or again if the last one
   * lapsed (the driver was cut off for longer than its lease: the metadata server removed the
   * directory with what it held). A directory made already, unbound (an earlier version's
   * broadcast, say), is bound as it is.
   */
  synchronized void bindAppDir() throws IOException {
    if (session != null && !session.hasEnded()) {
      return;
    }
    NodeKernel nk = client();
    Session s = nk.session(Duration.ofMillis(conf.driverTimeoutMs));
    try {
      String dir = appDir();
      if (!conf.root().equals("/")) {
        nk.mkdir(conf.root(), true);
      }
      try {
        nk.createContainer(dir, NodeType.DIRECTORY, CreateOptions.defaults().session(s));
      } catch (NodeKernelException.AlreadyExists e) {
        s.bindExisting(dir);
      }
    } catch (IOException | RuntimeException e) {
      try {
        s.close();
      } catch (IOException closing) {
        e.addSuppressed(closing);
      }
      throw e;
    }
    Session old = session;
    session = s;
    if (old != null) {
      old.close();
    }
  }

  String shuffleDir(int shuffleId) {
    return appDir() + "/s" + shuffleId;
  }

  String indexPath(int shuffleId, long mapTaskId) {
    return shuffleDir(shuffleId) + "/idx/m" + mapTaskId;
  }

  /**
   * Opens the slot's File of partition {@code p} to append a segment, creating it (and the
   * partition's Bag, made by its first writer) if new; {@code direct}: with the smaller buffer of a
   * writer that has every partition's segment open.
   */
  NkOutputStream openSlotFile(int shuffleId, int p, int slot, boolean direct) throws IOException {
    String bag = shuffleDir(shuffleId) + "/p" + p;
    String path = bag + "/e" + executorId() + "-t" + slot;
    CreateOptions options = direct ? conf.directFileOptions : conf.fileOptions;
    NodeKernel nk = client();
    try {
      return nk.appendOrCreate(path, options);
    } catch (NodeKernelException.NotFound e) {
      // No Bag yet (or no shuffle directory any more, which the create reports).
      create(nk, bag, NodeType.BAG);
      return nk.appendOrCreate(path, options);
    }
  }

  /** Map indexes one batched get asks for. */
  static final int INDEX_BATCH = 1024;

  /**
   * The committed indexes of map attempts, each fetched once per JVM: the ones not cached yet in
   * batched gets of up to {@link #INDEX_BATCH} keys, {@code readsInFlight} at a time. A map attempt
   * without a committed index has no entry.
   */
  Map<Long, MapIndex> indexes(int shuffleId, Collection<Long> mapTaskIds) throws IOException {
    Map<Long, MapIndex> cache = indexes.computeIfAbsent(shuffleId, id -> new ConcurrentHashMap<>());
    Map<Long, MapIndex> found = new HashMap<>();
    Set<Long> uncached = new LinkedHashSet<>();
    for (long id : mapTaskIds) {
      MapIndex idx = cache.get(id);
      if (idx != null) {
        found.put(id, idx);
      } else {
        uncached.add(id);
      }
    }
    List<Long> missing = new ArrayList<>(uncached);
    for (int from = 0; from < missing.size(); from += INDEX_BATCH) {
      List<Long> batch = missing.subList(from, Math.min(missing.size(), from + INDEX_BATCH));
      List<String> keys = new ArrayList<>(batch.size());
      for (long id : batch) {
        keys.add(indexPath(shuffleId, id));
      }
      List<byte[]> values;
      try {
        values = client().getMany(keys, conf.readsInFlight);
      } catch (NodeKernelException.DataLost | NodeKernelException.Unavailable e) {
        // One lost index (its storage server died) fails the whole batch: find which, so that
        // the reducer's FetchFailed names a map whose index is gone, not the batch's first.
        values = new ArrayList<>(keys.size());
        for (String key : keys) {
          values.add(lostAsMissing(key));
        }
      }
      for (int i = 0; i < batch.size(); i++) {
        if (values.get(i) != null) {
          MapIndex idx = MapIndex.decode(values.get(i));
          cache.put(batch.get(i), idx);
          found.put(batch.get(i), idx);
        }
      }
    }
    return found;
  }

  /** The value at {@code key}; null when it is missing or its storage server is gone. */
  private byte[] lostAsMissing(String key) throws IOException {
    try {
      return client().get(key);
    } catch (NodeKernelException.NotFound
        | NodeKernelException.DataLost
        | NodeKernelException.Unavailable e) {
      return null;
    }
  }

  @Override
  public <K, V, C> ShuffleHandle registerShuffle(int shuffleId, ShuffleDependency<K, V, C> dep) {
    String dir = shuffleDir(shuffleId);
    try {
      NodeKernel nk = client();
      if (isDriver) {
        bindAppDir();
        // Not with parents: the application's directory is the one bound to the session.
        create(nk, dir, NodeType.DIRECTORY);
      } else {
        nk.mkdir(dir, true);
      }
      create(nk, dir + "/idx", NodeType.TABLE);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot create shuffle directory " + dir, e);
    }
    if (SortShuffleManager.canUseSerializedShuffle(dep)) {
      // canUseSerializedShuffle holds only without map-side combine, where C is V.
      @SuppressWarnings("unchecked")
      ShuffleDependency<K, V, V> d = (ShuffleDependency<K, V, V>) (ShuffleDependency<?, ?, ?>) dep;
      return new SerializedShuffleHandle<>(shuffleId, d);
    }
    return new BaseShuffleHandle<>(shuffleId, dep);
  }

  private static void create(NodeKernel nk, String path, NodeType type) throws IOException {
    try {
      nk.createContainer(path, type, CreateOptions.defaults());
    } catch (NodeKernelException.AlreadyExists e) {
      // registered again, or another task's writer made the Bag first: keep what is there
    }
  }

  @Override
  public <K, V> ShuffleWriter<K, V> getWriter(
      ShuffleHandle handle, long mapId, TaskContext ctx, ShuffleWriteMetricsReporter metrics) {
    NkExecutorComponents components = new NkExecutorComponents(this, metrics);
    // Backstop: whatever way the task ends, an uncommitted map output is aborted and its slot
    // freed.
    ctx.addTaskCompletionListener((TaskCompletionListener) c -> components.abortAll(null));
    ShuffleWriter<K, V> inner;
    if (handle instanceof BaseShuffleHandle<?, ?, ?> base
        && SortShuffleWriter.shouldBypassMergeSort(sparkConf, base.dependency())) {
      // Where Spark would write a local file per reduce partition: a segment each, directly.
      @SuppressWarnings("unchecked")
      BaseShuffleHandle<K, V, ?> h = (BaseShuffleHandle<K, V, ?>) handle;
      return counted(new NkDirectWriter<>(h, mapId, metrics, components));
    }
    if (handle instanceof SerializedShuffleHandle) {
      @SuppressWarnings("unchecked")
      SerializedShuffleHandle<K, V> h = (SerializedShuffleHandle<K, V>) handle;
      SparkEnv env = SparkEnv.get();
      try {
        inner =
            new UnsafeShuffleWriter<>(
                env.blockManager(),
                ctx.taskMemoryManager(),
                h,
                mapId,
                ctx,
                env.conf(),
                metrics,
                components);
      } catch (SparkException e) {
        throw new IllegalStateException(e.getMessage(), e);
      }
    } else {
      @SuppressWarnings("unchecked")
      BaseShuffleHandle<K, V, Object> h = (BaseShuffleHandle<K, V, Object>) handle;
      inner = new SortShuffleWriter<>(h, mapId, ctx, metrics, components);
    }
    counted(inner);
    return new NkShuffleWriter<>(inner, components);
  }

  private <W extends ShuffleWriter<?, ?>> W counted(W writer) {
    writers.computeIfAbsent(writer.getClass().getSimpleName(), k -> new LongAdder()).increment();
    return writer;
  }

  void countChannel() {
    channels.increment();
  }

  /** How many partition writers this JVM opened as channels (whether Spark merged by channel). */
  long channelsOpened() {
    return channels.sum();
  }

  /** How many map tasks each writer class wrote in this JVM (which paths a job took). */
  Map<String, Long> writersUsed() {
    Map<String, Long> used = new TreeMap<>();
    writers.forEach((k, v) -> used.put(k, v.sum()));
    return used;
  }

  @Override
  public <K, C> ShuffleReader<K, C> getReader(
      ShuffleHandle handle,
      int startMapIndex,
      int endMapIndex,
      int startPartition,
      int endPartition,
      TaskContext ctx,
      ShuffleReadMetricsReporter metrics) {
    @SuppressWarnings("unchecked")
    BaseShuffleHandle<K, ?, C> h = (BaseShuffleHandle<K, ?, C>) handle;
    return new NkShuffleReader<>(
        this, h, startMapIndex, endMapIndex, startPartition, endPartition, ctx, metrics);
  }

  /** Drops this JVM's cached indexes; on the driver, deletes the shuffle's data too. */
  @Override
  public boolean unregisterShuffle(int shuffleId) {
    indexes.remove(shuffleId);
    if (isDriver) {
      delete(shuffleDir(shuffleId));
    }
    return true;
  }

  private void delete(String path) {
    try {
      client().delete(path, true);
    } catch (NodeKernelException.NotFound e) {
      // nothing was written there
    } catch (IOException e) {
      throw new UncheckedIOException("cannot delete " + path, e);
    }
  }

  @Override
  public ShuffleBlockResolver shuffleBlockResolver() {
    return resolver;
  }

  /**
   * On the driver, deletes the application's shuffle directory and closes the session it was bound
   * to; closes the client.
   */
  @Override
  public void stop() {
    synchronized (this) {
      if (stopped || client == null) {
        stopped = true;
        return;
      }
    }
    try {
      if (isDriver && sparkConf.contains("spark.app.id")) {
        delete(appDir());
      }
    } finally {
      synchronized (this) {
        if (session != null) {
          try {
            session.close();
          } catch (IOException e) {
            // Renewed no more: what it bound goes when its lease lapses.
          }
          session = null;
        }
        stopped = true;
        client.close();
        client = null;
      }
      indexes.clear();
    }
  }
}

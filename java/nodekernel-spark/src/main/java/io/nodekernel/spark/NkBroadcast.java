package io.nodekernel.spark;

import io.nodekernel.CreateOptions;
import io.nodekernel.NkInputStream;
import io.nodekernel.NkOutputStream;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import java.io.IOException;
import java.io.InputStream;
import java.io.ObjectOutputStream;
import java.io.UncheckedIOException;
import java.lang.ref.SoftReference;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerApplicationEnd;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.ShuffleManager;
import org.apache.spark.storage.BroadcastBlockId;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * A broadcast variable whose value is kept in NodeKernel rather than sent between executors by
 * Spark's {@code TorrentBroadcast}. Spark 3.5 and 4.0 have no way to plug another broadcast path
 * ({@code BroadcastManager} always uses {@code TorrentBroadcastFactory}), so user code creates
 * these explicitly, where it would call {@code sc.broadcast(value)}:
 *
 * <pre>{@code
 * Broadcast<Map<String, Long>> lookup = NkBroadcast.create(jsc, bigMap);
 * rdd.map(k -> lookup.value().get(k));
 * ...
 * lookup.destroy();   // or leave it to SparkContext.stop()
 * }</pre>
 *
 * <p>{@link #create} serializes the value once on the driver with Spark's serializer ({@code
 * spark.serializer}), compressed as {@code spark.broadcast.compress} says and encrypted when {@code
 * spark.io.encryption.enabled}, into one NodeKernel File {@code <root>/<appId>/b<id>} ({@code
 * <root>} is {@link NkShuffleConf#ROOT}). Its blocks have no location affinity. The first {@link
 * #value()} in each JVM streams the File back and deserializes it; the value is then kept in a
 * per-JVM cache (softly referenced, so the GC may drop it under memory pressure and the next use
 * reads it again) shared by the JVM's tasks, and concurrent tasks wait for one read. The serialized
 * object carries its id and path, not the value; executors connect with the same keys as the
 * shuffle ({@link NkShuffleConf#META}, {@link NkShuffleConf#CONFIG}), through the NodeKernel
 * shuffle manager's client when it is the shuffle manager, else through a client of their own.
 *
 * <p>Lifecycle: {@link #unpersist()} drops the copy cached in this JVM (the driver's, and in local
 * mode the executors' too, since they share the JVM); copies in other executors' JVMs stay until
 * their GC drops them. {@link #destroy()} also deletes the File; serializing the broadcast into a
 * task afterwards fails, and a copy already on an executor fails to read with an exception naming
 * the broadcast and its path. When the application ends ({@code SparkContext.stop()}) the driver
 * deletes the Files of the broadcasts not destroyed, whichever shuffle manager is in use. These
 * broadcasts are not registered with Spark's {@code ContextCleaner}: one that is no longer
 * referenced keeps its File until it is destroyed or the application ends.
 *
 * @param <T> the value's type
 */
public final class NkBroadcast<T> extends Broadcast<T> {
  /** Ids of this JVM's broadcasts (unique within an application, which is all paths need). */
  private static final AtomicLong NEXT_ID = new AtomicLong();

  /** Values read (or written) in this JVM, by path. */
  private static final Map<String, Slot> CACHE = new ConcurrentHashMap<>();

  /** Applications of this (driver) JVM that created broadcasts, by application id. */
  private static final Map<String, App> APPS = new ConcurrentHashMap<>();

  /** Reads of a value from NodeKernel in this JVM. */
  private static final AtomicLong READS = new AtomicLong();

  /** Stands for a null value in the cache (a null referent means "dropped by the GC"). */
  private static final Object NULL = new Object();

  /** This JVM's own client, when the shuffle manager is not NodeKernel's; guarded by the class. */
  private static NodeKernel ownClient;

  private static String ownMeta;
  private static String ownConfig;

  /** The NodeKernel File holding the serialized value. */
  private final String path;

  /** The application that created it (only known on the driver). */
  private final transient String appId;

  private NkBroadcast(long id, String path, String appId) {
    super(id, anyRef());
    this.path = path;
    this.appId = appId;
  }

  /** The class tag Spark's serializers get: any object (no primitive specialization). */
  @SuppressWarnings("unchecked")
  private static <T> ClassTag<T> anyRef() {
    return (ClassTag<T>) (ClassTag<?>) ClassTag$.MODULE$.AnyRef();
  }

  /** {@link #create(SparkContext, Object)} for Java's {@code JavaSparkContext}. */
  public static <T> NkBroadcast<T> create(JavaSparkContext jsc, T value) {
    return create(jsc.sc(), value);
  }

  /**
   * Writes {@code value} to NodeKernel and returns a broadcast of it; call on the driver, where
   * {@code sc.broadcast(value)} would be called.
   *
   * @throws UncheckedIOException when NodeKernel cannot be reached or the File cannot be written
   *     (what was written is deleted)
   */
  public static <T> NkBroadcast<T> create(SparkContext sc, T value) {
    Objects.requireNonNull(sc, "sc");
    SparkLine.check();
    if (sc.isStopped()) {
      throw new IllegalStateException("cannot broadcast: the SparkContext is stopped");
    }
    SparkEnv env = SparkEnv.get();
    String appId = sc.applicationId();
    NkShuffleConf conf = new NkShuffleConf(env.conf());
    String dir = conf.appDir(appId);
    long id = NEXT_ID.getAndIncrement();
    NkBroadcast<T> b = new NkBroadcast<>(id, dir + "/b" + id, appId);
    // Registered before the File exists, so that the application's end deletes it whatever
    // happens below.
    App app =
        APPS.computeIfAbsent(
            appId,
            a -> {
              App listener = new App(a, dir);
              sc.addSparkListener(listener);
              return listener;
            });
    app.paths.add(b.path);
    try {
      NodeKernel nk = client(env);
      if (env.shuffleManager() instanceof NodeKernelShuffleManager manager) {
        // Bound to the driver's session: it goes with a driver that dies without stop().
        manager.bindAppDir();
      } else {
        nk.mkdir(dir, true);
      }
      b.write(nk, env, value);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot write " + b + " to NodeKernel", e);
    }
    // The driver keeps the value, as Spark's own broadcasts do.
    Slot slot = new Slot();
    slot.set(value);
    CACHE.put(b.path, slot);
    return b;
  }

  /** The NodeKernel File holding the serialized value. */
  public String path() {
    return path;
  }

  private BroadcastBlockId blockId() {
    return new BroadcastBlockId(id(), "");
  }

  /** Serializes the value into a new File; a failed write deletes what it created. */
  private void write(NodeKernel nk, SparkEnv env, T value) throws IOException {
    NkOutputStream out = nk.createFile(path, CreateOptions.defaults());
    try {
      SerializerManager sm = env.serializerManager();
      SerializationStream s =
          env.serializer().newInstance().serializeStream(sm.wrapStream(blockId(), out));
      s.writeObject(value, anyRef());
      s.close();
      out.close(); // closed by the serialization stream already; this makes sure it is published
    } catch (Exception e) { // also what Scala code throws undeclared; rethrown as it is
      try {
        out.abort();
        nk.delete(path, false);
      } catch (IOException | RuntimeException suppressed) {
        e.addSuppressed(suppressed);
      }
      throw e;
    }
  }

  /** The value: from this JVM's cache, else read from NodeKernel (once, however many tasks ask). */
  @Override
  public T getValue() {
    Slot slot = CACHE.computeIfAbsent(path, p -> new Slot());
    synchronized (slot) {
      Object v = slot.get();
      if (v == null) {
        v = read();
        slot.set(v);
      }
      @SuppressWarnings("unchecked")
      T t = (T) (v == NULL ? null : v);
      return t;
    }
  }

  private Object read() {
    SparkEnv env = SparkEnv.get();
    if (env == null) {
      throw new IllegalStateException(
          "cannot read " + this + ": no SparkEnv (not in a Spark driver or executor)");
    }
    READS.incrementAndGet();
    try (NkInputStream in = client(env).open(path)) {
      InputStream s = env.serializerManager().wrapStream(blockId(), in);
      DeserializationStream d = env.serializer().newInstance().deserializeStream(s);
      try {
        return d.readObject(ClassTag$.MODULE$.AnyRef());
      } finally {
        d.close();
      }
    } catch (NodeKernelException.NotFound e) {
      throw new UncheckedIOException(
          "cannot read "
              + this
              + ": "
              + path
              + " is not in NodeKernel (the broadcast was destroyed, or its application ended)",
          e);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read " + this + " from NodeKernel", e);
    } catch (Exception e) {
      // Deserialization failures (a class missing on the executor, a corrupt stream); Scala code
      // may throw checked exceptions undeclared.
      throw new IllegalStateException("cannot deserialize " + this + ": " + e, e);
    }
  }

  /** Drops this JVM's cached copy; the next use reads the File again. */
  @Override
  public void doUnpersist(boolean blocking) {
    CACHE.remove(path);
  }

  /** Drops this JVM's cached copy and deletes the File. */
  @Override
  public void doDestroy(boolean blocking) {
    CACHE.remove(path);
    if (appId != null && !APPS.containsKey(appId)) {
      return; // its application has ended, which deleted the File
    }
    try {
      client(SparkEnv.get()).delete(path, false);
    } catch (NodeKernelException.NotFound e) {
      // already gone with its application's directory
    } catch (IOException e) {
      throw new UncheckedIOException("cannot delete " + this + " from NodeKernel", e);
    }
    App app = appId == null ? null : APPS.get(appId);
    if (app != null) {
      app.paths.remove(path);
    }
  }

  /** A destroyed broadcast cannot go into a task, as with Spark's own broadcasts. */
  private void writeObject(ObjectOutputStream out) throws IOException {
    assertValid();
    out.defaultWriteObject();
  }

  @Override
  public String toString() {
    return "NkBroadcast(" + id() + ", " + path + ")";
  }

  /** Reads from NodeKernel in this JVM so far (for tests). */
  static long reads() {
    return READS.get();
  }

  /** The client to use in this JVM: the NodeKernel shuffle manager's, else one of our own. */
  private static NodeKernel client(SparkEnv env) throws IOException {
    if (env == null) {
      throw new IllegalStateException("no SparkEnv: not in a Spark driver or executor");
    }
    ShuffleManager sm = env.shuffleManager();
    if (sm instanceof NodeKernelShuffleManager) {
      return ((NodeKernelShuffleManager) sm).client();
    }
    return ownClient(env.conf());
  }

  private static synchronized NodeKernel ownClient(SparkConf conf) throws IOException {
    String meta = conf.get(NkShuffleConf.META, null);
    String config = conf.get(NkShuffleConf.CONFIG, null);
    if (ownClient == null || !Objects.equals(meta, ownMeta) || !Objects.equals(config, ownConfig)) {
      // A new application with other settings: the old client's application is over.
      closeOwnClient();
      ownClient = NodeKernel.connect(meta, config);
      ownMeta = meta;
      ownConfig = config;
    }
    return ownClient;
  }

  private static synchronized void closeOwnClient() {
    if (ownClient != null) {
      ownClient.close();
      ownClient = null;
    }
  }

  /** A cached value, softly referenced; its monitor makes one reader load it. */
  private static final class Slot {
    private SoftReference<Object> ref;

    /** The value ({@link #NULL} for null), or null when not loaded or dropped by the GC. */
    Object get() {
      return ref == null ? null : ref.get();
    }

    void set(Object value) {
      ref = new SoftReference<>(value == null ? NULL : value);
    }
  }

  /** The driver's record of an application's broadcasts; deletes them when it ends. */
  private static final class App extends SparkListener {
    final String appId;
    final String dir;
    final Set<String> paths = ConcurrentHashMap.newKeySet();

    App(String appId, String dir) {
      this.appId = appId;
      this.dir = dir;
    }

    /**
     * Deletes the broadcasts' Files and, when nothing else is in it, the application's directory.
     * Runs before SparkEnv stops (and with it the shuffle manager and its client).
     */
    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd end) {
      APPS.remove(appId, this);
      CACHE.keySet().removeIf(p -> p.startsWith(dir + "/"));
      IOException failed = null;
      try {
        NodeKernel nk = client(SparkEnv.get());
        for (String p : paths) {
          try {
            nk.delete(p, false);
          } catch (NodeKernelException.NotFound e) {
            // destroyed meanwhile
          } catch (IOException e) {
            if (failed == null) {
              failed = e;
            } else {
              failed.addSuppressed(e);
            }
          }
        }
        try {
          nk.delete(dir, false);
        } catch (NodeKernelException.NotFound | NodeKernelException.NotEmpty e) {
          // shuffle data there: the NodeKernel shuffle manager's stop() deletes it
        }
      } catch (IOException e) {
        if (failed == null) {
          failed = e;
        } else {
          failed.addSuppressed(e);
        }
      } finally {
        closeOwnClient();
      }
      if (failed != null) {
        throw new UncheckedIOException(
            "cannot delete the NodeKernel broadcasts of application " + appId + " in " + dir,
            failed);
      }
    }
  }
}

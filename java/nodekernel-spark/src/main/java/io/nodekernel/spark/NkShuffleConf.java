package io.nodekernel.spark;

import io.nodekernel.CreateOptions;
import org.apache.spark.SparkConf;

/** The configuration keys of the NodeKernel shuffle, read once from the SparkConf. */
public final class NkShuffleConf {
  /** Metadata servers ({@code host:port}, comma-separated); unset: as {@code nk} connects. */
  public static final String META = "spark.nodekernel.meta";

  /** A client configuration file (TOML); unset: {@code NK_CONFIG}, if set. */
  public static final String CONFIG = "spark.nodekernel.config";

  /** The parent of each application's directory {@code <root>/<appId>} (shuffles, broadcasts). */
  public static final String ROOT = "spark.nodekernel.shuffle.root";

  public static final String DEFAULT_ROOT = "/spark-shuffle";

  /** Block reads a reducer keeps outstanding (0: the client's default, 16). */
  public static final String READS_IN_FLIGHT = "spark.nodekernel.shuffle.readsInFlight";

  /** Whether map output goes to storage servers on the writer's host first (default true). */
  public static final String LOCAL_PLACEMENT = "spark.nodekernel.shuffle.localPlacement";

  /** The preferred storage class of map output (-1, the default: the parent's preference). */
  public static final String STORAGE_CLASS = "spark.nodekernel.shuffle.storageClass";

  /**
   * The lease of the driver's session, which the application's directory is bound to: how long the
   * directory outlives a driver that died without {@code stop()} (or stalled, cut off from the
   * metadata servers) before the metadata server removes it. The driver renews the session every
   * third of this. Default 10 minutes; at least 1 s, and the metadata servers keep it at most 1 h.
   */
  public static final String DRIVER_TIMEOUT = "spark.nodekernel.shuffle.driverTimeout";

  public static final long DEFAULT_DRIVER_TIMEOUT_MS = 600_000;

  final long driverTimeoutMs;

  final String meta;
  final String config;

  /** The root without its trailing slashes (empty for {@code /}). */
  private final String root;

  final int readsInFlight;
  final CreateOptions fileOptions;

  /**
   * For {@link NkDirectWriter}, whose map task has a segment open in every partition at once: a
   * smaller write buffer per segment (at most 384 KiB instead of 5 MiB).
   */
  final CreateOptions directFileOptions;

  NkShuffleConf(SparkConf conf) {
    meta = conf.get(META, null);
    config = conf.get(CONFIG, null);
    String r = conf.get(ROOT, DEFAULT_ROOT);
    if (!r.startsWith("/")) {
      throw new IllegalArgumentException(ROOT + " must be an absolute path: " + r);
    }
    while (r.endsWith("/")) {
      r = r.substring(0, r.length() - 1);
    }
    root = r;
    driverTimeoutMs = conf.getTimeAsMs(DRIVER_TIMEOUT, DEFAULT_DRIVER_TIMEOUT_MS + "ms");
    if (driverTimeoutMs < 1000) {
      throw new IllegalArgumentException(DRIVER_TIMEOUT + " must be at least 1s");
    }
    readsInFlight = conf.getInt(READS_IN_FLIGHT, 0);
    if (readsInFlight < 0) {
      throw new IllegalArgumentException(READS_IN_FLIGHT + " must not be negative");
    }
    fileOptions =
        CreateOptions.defaults()
            .local(conf.getBoolean(LOCAL_PLACEMENT, true))
            .storageClass(conf.getInt(STORAGE_CLASS, -1));
    directFileOptions = fileOptions.buffer(256 << 10, 128 << 10);
  }

  /** The root of the application directories, {@code /} if it is the namespace's root. */
  String root() {
    return root.isEmpty() ? "/" : root;
  }

  /** The directory of an application's shuffles and broadcasts. */
  String appDir(String appId) {
    return root + "/" + appId;
  }
}

package io.nodekernel.spark;

import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Deletes the application directories that earlier versions of this jar left behind when their
 * driver died without {@code stop()}. Those drivers kept a lease KeyValue {@code
 * <root>/.drivers/<appId>} (the wall-clock time of its last renewal, its timeout, host and pid) and
 * renewed it while they ran; a directory whose lease was not renewed for longer than its timeout
 * belongs to a dead driver. This version's driver binds its directory to a session of its own
 * instead, and the metadata server removes it when the driver dies: it needs no cleaner. Needs only
 * the client jar and this one, no Spark:
 *
 * <pre>
 * java -cp nodekernel-spark-3.5_2.12-VERSION.jar:nodekernel-client-VERSION.jar \
 *     io.nodekernel.spark.NkShuffleCleaner [--meta HOST:PORT,...] [--config FILE] [--root /spark-shuffle]
 * </pre>
 *
 * Connects as {@code nk} does without {@code --meta}/{@code --config} ({@code NK_META}, {@code
 * NK_CONFIG}); prints each deleted application id. Directories without a lease (this version's, and
 * those of versions before leases) are left alone. The clocks of the dead drivers and the cleaner
 * must agree to well within the timeout.
 */
public final class NkShuffleCleaner {
  /**
   * The Table of the earlier versions' leases: that of {@code <root>/<appId>} is {@code <appId>}.
   */
  static final String LEASES = ".drivers";

  private NkShuffleCleaner() {}

  public static void main(String[] args) throws Exception {
    String meta = null;
    String config = null;
    String root = NkShuffleConf.DEFAULT_ROOT;
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (i + 1 < args.length
          && (a.equals("--meta") || a.equals("--config") || a.equals("--root"))) {
        String v = args[++i];
        switch (a) {
          case "--meta" -> meta = v;
          case "--config" -> config = v;
          default -> root = v;
        }
      } else {
        System.err.println(
            "usage: NkShuffleCleaner [--meta HOST:PORT,...] [--config FILE] [--root DIR]");
        System.exit(2);
      }
    }
    try (NodeKernel nk = NodeKernel.connect(meta, config)) {
      List<String> deleted = sweep(nk, root, System.currentTimeMillis());
      for (String app : deleted) {
        System.out.println("deleted " + app);
      }
    }
  }

  /**
   * Whether a lease value says its driver is gone at {@code nowMs}: not renewed for longer than its
   * timeout. An unreadable value is not expired (it is left alone).
   */
  static boolean expired(byte[] lease, long nowMs) {
    String[] f = new String(lease, StandardCharsets.UTF_8).trim().split(" ");
    try {
      return nowMs - Long.parseLong(f[0]) > Long.parseLong(f[1]);
    } catch (RuntimeException e) {
      return false;
    }
  }

  /**
   * Deletes the application directories under {@code root} whose lease has expired at {@code
   * nowMs}, then their leases; the deleted ones' names.
   */
  static List<String> sweep(NodeKernel nk, String root, long nowMs) throws IOException {
    List<String> deleted = new ArrayList<>();
    String parent = root.endsWith("/") ? root : root + "/";
    List<String> apps;
    try {
      apps = nk.enumerate(parent + LEASES);
    } catch (NodeKernelException.NotFound e) {
      return deleted;
    }
    for (String app : apps) {
      byte[] lease;
      try {
        lease = nk.get(leasePath(root, app));
      } catch (NodeKernelException.NotFound | NodeKernelException.DataLost e) {
        // Deleted meanwhile, or lost with its storage server: left alone.
        continue;
      }
      if (!expired(lease, nowMs)) {
        continue;
      }
      // The directory first: a sweep stopped in between finds the lease again.
      deleteIfThere(nk, parent + app);
      deleteIfThere(nk, leasePath(root, app));
      deleted.add(app);
    }
    return deleted;
  }

  /**
   * The lease an earlier version kept for application {@code app}'s directory under {@code root}.
   */
  static String leasePath(String root, String app) {
    return (root.endsWith("/") ? root : root + "/") + LEASES + "/" + app;
  }

  private static void deleteIfThere(NodeKernel nk, String path) throws IOException {
    try {
      nk.delete(path, true);
    } catch (NodeKernelException.NotFound e) {
      // deleted meanwhile (its driver's stop(), another sweep)
    }
  }
}

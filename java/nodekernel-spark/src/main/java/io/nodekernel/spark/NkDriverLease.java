package io.nodekernel.spark;

import io.nodekernel.CreateOptions;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeType;
import java.io.IOException;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * An application directory's lease: the driver keeps a KeyValue {@code <root>/.drivers/<appId>}
 * (outside the directory, whose children stay the shuffles) holding the wall-clock time of its last
 * renewal and its timeout, renewed every tenth of the timeout while the application runs. A
 * directory whose lease is older than its timeout belongs to a driver that died without {@code
 * stop()} (killed, its host lost): {@link #sweep} deletes it. Every driver sweeps the root once
 * when it first writes shuffle data; {@link NkShuffleCleaner} does the same from the command line.
 * Directories without a lease (of an earlier version of this jar) are left alone. The clocks of
 * drivers and sweepers must agree to well within the timeout.
 */
final class NkDriverLease {
  /** The Table of the leases: that of {@code <root>/<appId>} is its KeyValue {@code <appId>}. */
  static final String TABLE = ".drivers";

  private final String root;
  private final long timeoutMs;
  private ScheduledExecutorService renewer;

  NkDriverLease(String root, long timeoutMs) {
    this.root = root;
    this.timeoutMs = timeoutMs;
  }

  /** Takes the lease of {@code appDir} (once), renews it from now on, sweeps the root once. */
  synchronized void start(NodeKernel nk, String appDir) throws IOException {
    if (renewer != null) {
      return;
    }
    String path = path(root, appDir.substring(appDir.lastIndexOf('/') + 1));
    try {
      nk.createContainer(
          path.substring(0, path.lastIndexOf('/')), NodeType.TABLE, CreateOptions.defaults());
    } catch (NodeKernelException.AlreadyExists e) {
      // another driver's
    }
    nk.put(path, value(System.currentTimeMillis(), timeoutMs));
    renewer =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "nodekernel-driver-lease");
              t.setDaemon(true);
              return t;
            });
    long every = Math.max(100, timeoutMs / 10);
    renewer.scheduleWithFixedDelay(
        () -> {
          try {
            nk.put(path, value(System.currentTimeMillis(), timeoutMs));
          } catch (IOException | RuntimeException e) {
            // the next renewal tries again; the timeout allows nine misses
          }
        },
        every,
        every,
        TimeUnit.MILLISECONDS);
    String self = appDir.substring(appDir.lastIndexOf('/') + 1);
    renewer.execute(
        () -> {
          try {
            sweep(nk, root, self, System.currentTimeMillis());
          } catch (IOException | RuntimeException e) {
            // a sweep is best effort; the next driver or the cleaner does it
          }
        });
  }

  /** Stops renewing (the application's directory is deleted next, then the lease). */
  synchronized void stop() {
    if (renewer != null) {
      renewer.shutdownNow();
      try {
        renewer.awaitTermination(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      renewer = null;
    }
  }

  static byte[] value(long renewedAtMs, long timeoutMs) {
    String host;
    try {
      host = InetAddress.getLocalHost().getHostName();
    } catch (IOException e) {
      host = "?";
    }
    long pid = ProcessHandle.current().pid();
    return (renewedAtMs + " " + timeoutMs + " " + host + " " + pid)
        .getBytes(StandardCharsets.UTF_8);
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
   * nowMs}, but {@code except}'s (null: none); the deleted ones' names.
   */
  static List<String> sweep(NodeKernel nk, String root, String except, long nowMs)
      throws IOException {
    List<String> deleted = new ArrayList<>();
    String parent = root.endsWith("/") ? root : root + "/";
    List<String> apps;
    try {
      apps = nk.enumerate(parent + TABLE);
    } catch (NodeKernelException.NotFound e) {
      return deleted;
    }
    for (String app : apps) {
      if (app.equals(except)) {
        continue;
      }
      byte[] lease;
      try {
        lease = nk.get(path(root, app));
      } catch (NodeKernelException.NotFound | NodeKernelException.DataLost e) {
        // Deleted meanwhile, or lost with its storage server: left alone (a live driver puts it
        // again).
        continue;
      }
      if (!expired(lease, nowMs)) {
        continue;
      }
      // The directory first: a sweep stopped in between finds the lease again.
      deleteIfThere(nk, parent + app);
      deleteIfThere(nk, path(root, app));
      deleted.add(app);
    }
    return deleted;
  }

  /** The lease of application {@code app}'s directory under {@code root}. */
  static String path(String root, String app) {
    return (root.endsWith("/") ? root : root + "/") + TABLE + "/" + app;
  }

  static void deleteIfThere(NodeKernel nk, String path) throws IOException {
    try {
      nk.delete(path, true);
    } catch (NodeKernelException.NotFound e) {
      // deleted meanwhile (its driver's stop(), another sweep), or never made
    }
  }
}

package io.nodekernel.spark;

import io.nodekernel.NodeKernel;
import java.util.List;

/**
 * Deletes the directories of applications whose driver died without {@code stop()}: those under the
 * shuffle root whose lease ({@link NkDriverLease}) was not renewed for longer than its driver's
 * {@code spark.nodekernel.shuffle.driverTimeout}. Needs only the client jar and this one, no Spark:
 *
 * <pre>
 * java -cp nodekernel-spark-3.5_2.12-VERSION.jar:nodekernel-client-VERSION.jar \
 *     io.nodekernel.spark.NkShuffleCleaner [--meta HOST:PORT,...] [--config FILE] [--root /spark-shuffle]
 * </pre>
 *
 * Connects as {@code nk} does without {@code --meta}/{@code --config} ({@code NK_META}, {@code
 * NK_CONFIG}); prints each deleted application id.
 */
public final class NkShuffleCleaner {
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
      List<String> deleted = NkDriverLease.sweep(nk, root, null, System.currentTimeMillis());
      for (String app : deleted) {
        System.out.println("deleted " + app);
      }
    }
  }
}

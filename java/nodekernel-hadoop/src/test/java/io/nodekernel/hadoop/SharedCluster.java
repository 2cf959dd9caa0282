package io.nodekernel.hadoop;

import io.nodekernel.TestCluster;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;

/**
 * One NodeKernel cluster for all the tests of this JVM: started on first use, stopped by a shutdown
 * hook (the contract suites make a new contract per test method).
 */
final class SharedCluster {
  private static TestCluster cluster;

  private SharedCluster() {}

  /** The cluster, started on the first call. */
  static synchronized TestCluster get() {
    if (cluster == null) {
      try {
        TestCluster started = TestCluster.start();
        Runtime.getRuntime()
            .addShutdownHook(
                new Thread(
                    () -> {
                      try {
                        started.close();
                      } catch (IOException e) {
                        throw new UncheckedIOException(e);
                      }
                    },
                    "nk-test-cluster-stop"));
        cluster = started;
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted while starting the test cluster", e);
      }
    }
    return cluster;
  }

  /** {@code nk://meta/} of the shared cluster. */
  static URI uri() {
    return URI.create("nk://" + get().meta() + "/");
  }

  /** {@code conf} with the cluster's client configuration (its long timeout) set. */
  static Configuration configure(Configuration conf) {
    conf.set(NodeKernelFileSystem.CONFIG_KEY, get().clientConfig());
    return conf;
  }
}

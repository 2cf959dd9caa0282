package io.nodekernel;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.rules.ExternalResource;

/**
 * A real NodeKernel cluster for tests: {@code nk up} on port 0 with its own data directory, and a
 * client configuration whose timeout only catches hangs. The binary is {@code -Dnk.bin} (set by the
 * build), else {@code NK_BIN}, else {@code target/debug/nk} of the workspace.
 */
public final class TestCluster implements AutoCloseable {
  /** Every wait here only catches a hang. */
  public static final long HANG_SECONDS = 120;

  private static final Pattern META = Pattern.compile("metadata server at (\\S+)");

  private final Process proc;
  private final Path dir;
  private final Path log;
  private final String meta;
  private final Path clientConfig;
  private boolean stoppedOnce;

  private TestCluster(List<String> extra) throws IOException, InterruptedException {
    dir = Files.createTempDirectory("nk-java-");
    log = dir.resolve("up.log");
    List<String> cmd = new ArrayList<>();
    cmd.add(binary());
    cmd.addAll(
        List.of(
            "up",
            "--port",
            "0",
            "--dram",
            "1GiB",
            "--file",
            "0",
            "--data-dir",
            dir.resolve("data").toString()));
    cmd.addAll(extra);
    proc = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
    meta = waitFor(META);
    waitFor(Pattern.compile("export NK_META="));
    clientConfig = dir.resolve("client.toml");
    Files.writeString(
        clientConfig,
        "[client]\ntimeout_ms = " + HANG_SECONDS * 1000 + "\n",
        StandardCharsets.UTF_8);
    Process status =
        new ProcessBuilder(
                binary(), "status", "--wait", "--timeout", "" + HANG_SECONDS, "--meta", meta)
            .redirectErrorStream(true)
            .start();
    String out = new String(status.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (status.waitFor() != 0) {
      close();
      throw new IOException("the cluster did not become ready: " + out);
    }
  }

  /**
   * A cluster and a client of it for one test class, started before its tests and stopped after
   * them: {@code @ClassRule public static final TestCluster.Rule CLUSTER = new
   * TestCluster.Rule();}.
   */
  public static final class Rule extends ExternalResource {
    private TestCluster cluster;
    private NodeKernel client;

    @Override
    protected void before() throws Throwable {
      cluster = start();
      client = cluster.connect();
    }

    @Override
    protected void after() {
      if (client != null) {
        client.close();
      }
      if (cluster != null) {
        try {
          cluster.close();
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      }
    }

    public TestCluster cluster() {
      return cluster;
    }

    /** A client of the cluster, shared by the class's tests. */
    public NodeKernel client() {
      return client;
    }
  }

  /** Starts a cluster with 1 GiB of DRAM and no file store. */
  public static TestCluster start() throws IOException, InterruptedException {
    return new TestCluster(List.of());
  }

  /** Starts a cluster with extra {@code nk up} arguments. */
  public static TestCluster start(String... extra) throws IOException, InterruptedException {
    return new TestCluster(List.of(extra));
  }

  public static String binary() {
    String bin = System.getProperty("nk.bin");
    if (bin == null || bin.isEmpty()) {
      bin = System.getenv("NK_BIN");
    }
    if (bin == null || bin.isEmpty()) {
      bin = "../../target/debug/nk";
    }
    if (!Files.isExecutable(Path.of(bin))) {
      throw new IllegalStateException(
          "no nk binary at " + bin + ": run `cargo build -p nodekernel-cli` or set -Dnk.bin");
    }
    return Path.of(bin).toAbsolutePath().toString();
  }

  private String waitFor(Pattern p) throws IOException, InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(HANG_SECONDS);
    while (System.nanoTime() < deadline) {
      String out = Files.readString(log, StandardCharsets.UTF_8);
      Matcher m = p.matcher(out);
      if (m.find()) {
        return m.groupCount() > 0 ? m.group(1) : m.group();
      }
      if (!proc.isAlive()) {
        throw new IOException("nk up exited: " + out);
      }
      Thread.sleep(50);
    }
    throw new IOException("nk up did not print " + p + " in " + HANG_SECONDS + " s");
  }

  /** The metadata server's address ({@code host:port}). */
  public String meta() {
    return meta;
  }

  /** A client configuration file (a long timeout: tests must not fail on a slow machine). */
  public String clientConfig() {
    return clientConfig.toString();
  }

  /** The cluster's temporary directory (removed on close). */
  public Path dir() {
    return dir;
  }

  /** A new client of this cluster. */
  public NodeKernel connect() throws IOException {
    return NodeKernel.connect(meta, clientConfig.toString());
  }

  /**
   * Stops the cluster (SIGTERM, then SIGKILL after the hang timeout). A cluster that had stopped by
   * itself before (it should not) has its exit status and log printed, so a test that then failed
   * to reach it says why.
   */
  public void stop() {
    try {
      if (!proc.isAlive() && !stoppedOnce) {
        System.err.println(
            "nk up ("
                + dir
                + ") had exited by itself with status "
                + proc.exitValue()
                + "; its log:");
        System.err.println(Files.readString(log, StandardCharsets.UTF_8));
      }
      stoppedOnce = true;
      if (proc.isAlive()) {
        proc.destroy();
        if (!proc.waitFor(HANG_SECONDS, TimeUnit.SECONDS)) {
          proc.destroyForcibly().waitFor();
        }
      }
    } catch (IOException e) {
      System.err.println("cannot read the log of nk up (" + dir + "): " + e);
    } catch (InterruptedException e) {
      proc.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void close() throws IOException {
    stop();
    // A task of the cluster that panicked (the process lives on without
    // it: a listener gone, say) is worth its log too.
    String out = Files.readString(log, StandardCharsets.UTF_8);
    if (out.contains("panicked")) {
      System.err.println("nk up (" + dir + ") logged a panic; its log:");
      System.err.println(out);
    }
    try (Stream<Path> all = Files.walk(dir)) {
      all.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }
}

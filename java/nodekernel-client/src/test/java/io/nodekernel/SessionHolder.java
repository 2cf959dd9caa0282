package io.nodekernel;

import java.nio.charset.StandardCharsets;

/**
 * A process that holds a session (ClientTest kills it): connects to {@code args[0]} with the client
 * configuration {@code args[1]}, creates the Directory {@code args[2]} bound to a session of {@code
 * args[3]} ms, writes a File in it, prints "ready" and sleeps until it is killed.
 */
public final class SessionHolder {
  private SessionHolder() {}

  public static void main(String[] args) throws Exception {
    NodeKernel nk = NodeKernel.connect(args[0], args[1]);
    Session s = nk.session(java.time.Duration.ofMillis(Long.parseLong(args[3])));
    nk.createContainer(args[2], NodeType.DIRECTORY, CreateOptions.defaults().session(s));
    try (NkOutputStream out = nk.createFile(args[2] + "/data")) {
      out.write("held while the process lives".getBytes(StandardCharsets.UTF_8));
    }
    System.out.println("ready");
    System.out.flush();
    Thread.sleep(600_000);
  }
}

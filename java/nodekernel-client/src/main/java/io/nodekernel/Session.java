package io.nodekernel;

import java.io.IOException;
import java.time.Duration;
import java.util.Objects;

/**
 * A session of a client ({@link NodeKernel#session(Duration)}): a lease the library renews in the
 * background, every third of it. A node created with {@link CreateOptions#session(Session)}, or
 * bound later with {@link #bindExisting(String)}, is removed with its subtree by the metadata
 * server when the session is closed, or when its lease lapses because this process stopped renewing
 * it (killed, crashed, hung, cut off): a job binds its working directory and everything it writes
 * inside goes with it. See docs/lifecycle.md, "Sessions".
 *
 * <pre>{@code
 * try (Session s = nk.session(Session.DEFAULT_LEASE)) {
 *   nk.createContainer("/jobs/j1", NodeType.DIRECTORY, CreateOptions.defaults().session(s));
 *   // ... write under /jobs/j1 ...
 * } // /jobs/j1 is gone
 * }</pre>
 *
 * <p>Thread-safe. Closing the client does not end its sessions; a session collected unclosed is
 * closed in the background then (its lease lapses if that does not get through).
 */
public final class Session implements AutoCloseable {
  /** The lease a session gets unless asked otherwise. */
  public static final Duration DEFAULT_LEASE = Duration.ofSeconds(10);

  private final Handle handle;
  private final Duration lease;

  Session(long handle, Duration lease) {
    this.handle = new Handle(this, handle, Session::forget);
    this.lease = lease;
  }

  /** What happens to a session collected unclosed. */
  private static void forget(long h) {
    try {
      Native.dropSession(h);
    } catch (RuntimeException e) {
      // Nobody to tell: its lease lapses on the metadata servers.
    }
  }

  /** The lease the metadata servers gave (they keep it between 1 s and 1 h). */
  public Duration lease() {
    return lease;
  }

  /**
   * Whether the session has ended: closed, or its lease lapsed (this process was cut off from the
   * metadata servers for longer than a lease), so that what it bound is gone and it binds nothing
   * more.
   */
  public boolean hasEnded() {
    long h = handle.get();
    if (h == 0) {
      return true;
    }
    try {
      return Native.sessionEnded(h);
    } catch (IllegalStateException e) {
      return true; // closed meanwhile by another thread
    }
  }

  /**
   * Binds the existing node at {@code path} to the session, as a create with it would have: it is
   * removed, with its subtree, when the session ends. Binding it again does nothing. At most 4,096
   * nodes are bound to one session (bind a directory and create inside it for more).
   */
  public void bindExisting(String path) throws IOException {
    Native.bindSession(handle(), Objects.requireNonNull(path, "path"));
  }

  /** The native handle, for a create that binds to it. */
  long handle() throws NodeKernelException {
    long h = handle.get();
    if (h == 0) {
      throw new NodeKernelException.NotFound("the session is closed: nothing more is bound to it");
    }
    return h;
  }

  /**
   * Ends the session: everything bound to it is removed (with its subtree) before this returns.
   * Closing it again does nothing. If the metadata servers cannot be reached, the failure is thrown
   * and the session is renewed no more, so what it bound goes once its lease lapses.
   */
  @Override
  public void close() throws IOException {
    long h = handle.take();
    if (h != 0) {
      Native.closeSession(h);
    }
  }

  @Override
  public String toString() {
    return "Session[lease=" + lease + (hasEnded() ? ", ended" : "") + "]";
  }
}

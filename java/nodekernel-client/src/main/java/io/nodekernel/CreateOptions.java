package io.nodekernel;

import java.time.Duration;

/**
 * How a node is created besides its path and type. Immutable; each setter returns a copy.
 *
 * <pre>{@code
 * CreateOptions.defaults().storageClass(0).local(true)
 * }</pre>
 */
public final class CreateOptions {
  private static final CreateOptions DEFAULTS = new CreateOptions();

  int storageClass = -1;
  boolean local;
  boolean pinned;
  boolean enumerable = true;
  int mode = -1;
  long sizeHint;
  int bufferSize;
  int sliceSize;
  long ttlMillis; // 0: none given (the parent's child TTL applies), -1: never
  long childTtlMillis; // 0: none
  Session session; // null: none

  private CreateOptions() {}

  /** A copy to change one setting of (instances are never changed once handed out). */
  private CreateOptions copy() {
    CreateOptions c = new CreateOptions();
    c.storageClass = storageClass;
    c.local = local;
    c.pinned = pinned;
    c.enumerable = enumerable;
    c.mode = mode;
    c.sizeHint = sizeHint;
    c.bufferSize = bufferSize;
    c.sliceSize = sliceSize;
    c.ttlMillis = ttlMillis;
    c.childTtlMillis = childTtlMillis;
    c.session = session;
    return c;
  }

  /** No storage class preference, not local, not pinned, enumerable, default mode. */
  public static CreateOptions defaults() {
    return DEFAULTS;
  }

  /** Preferred storage class (0 is the fastest), or -1 to inherit the parent's preference. */
  public CreateOptions storageClass(int cls) {
    if (cls < -1 || cls > 254) {
      throw new IllegalArgumentException("storage class " + cls + " is not in -1..254");
    }
    CreateOptions c = copy();
    c.storageClass = cls;
    return c;
  }

  /**
   * Location affinity: blocks go to storage servers on this client's host first (see {@link
   * NodeKernel#localLocation()}), so a reader there reads them through memory.
   */
  public CreateOptions local(boolean local) {
    CreateOptions c = copy();
    c.local = local;
    return c;
  }

  /** Tier migration never moves the node's blocks. */
  public CreateOptions pinned(boolean pinned) {
    CreateOptions c = copy();
    c.pinned = pinned;
    return c;
  }

  /** For Tables: whether children are listed. */
  public CreateOptions enumerable(boolean enumerable) {
    CreateOptions c = copy();
    c.enumerable = enumerable;
    return c;
  }

  /** Permission bits (0 to 07777), or -1 for the default (0755 containers, 0644 data). */
  public CreateOptions mode(int mode) {
    if (mode < -1 || mode > 07777) {
      throw new IllegalArgumentException(
          "mode " + Integer.toOctalString(mode) + " is not 0..07777");
    }
    CreateOptions c = copy();
    c.mode = mode;
    return c;
  }

  /**
   * For a KeyValue: the bytes its writer will write, when known; a small value then shares a block
   * with other small values.
   */
  public CreateOptions sizeHint(long bytes) {
    if (bytes < 0) {
      throw new IllegalArgumentException("negative size hint " + bytes);
    }
    CreateOptions c = copy();
    c.sizeHint = bytes;
    return c;
  }

  /**
   * The writer's buffer: {@code bufferSize} bytes in flight at most, in transfers of {@code
   * sliceSize} (default 4 MiB of 1 MiB slices).
   */
  public CreateOptions buffer(int bufferSize, int sliceSize) {
    if (bufferSize <= 0 || sliceSize <= 0 || sliceSize > bufferSize) {
      throw new IllegalArgumentException(
          "buffer " + bufferSize + " and slice " + sliceSize + ": need 0 < slice <= buffer");
    }
    CreateOptions c = copy();
    c.bufferSize = bufferSize;
    c.sliceSize = sliceSize;
    return c;
  }

  /**
   * The node, with its subtree, expires this long after it is created (rounded up to whole
   * milliseconds; at most about 100 years): it then disappears as if deleted. Without one the
   * parent's child TTL, if any, applies. See docs/lifecycle.md.
   */
  public CreateOptions ttl(Duration ttl) {
    CreateOptions c = copy();
    c.ttlMillis = millis("TTL", ttl);
    return c;
  }

  /** The node never expires, not even under a parent with a child TTL. */
  public CreateOptions ttlNever() {
    CreateOptions c = copy();
    c.ttlMillis = -1;
    return c;
  }

  /**
   * For a Directory, Table or Bag: the TTL of the children created in it that name none ({@code
   * null}: no child TTL).
   */
  public CreateOptions childTtl(Duration ttl) {
    CreateOptions c = copy();
    c.childTtlMillis = ttl == null ? 0 : millis("child TTL", ttl);
    return c;
  }

  /**
   * Binds the node to {@code session} ({@code null}: to none): it is removed, with its subtree,
   * when the session is closed or its lease lapses (docs/lifecycle.md, "Sessions"). Only a node the
   * call creates is bound ({@link NodeKernel#appendOrCreate} leaves an existing File as it is);
   * nodes created inside a bound container need no binding of their own. The session must be of the
   * client that creates the node ({@link NodeKernelException.InvalidArgument} otherwise), and open
   * ({@link NodeKernelException.NotFound} once it has ended).
   */
  public CreateOptions session(Session session) {
    CreateOptions c = copy();
    c.session = session;
    return c;
  }

  /** A positive duration in whole milliseconds, rounded up. */
  static long millis(String what, Duration d) {
    if (d == null || d.isNegative() || d.isZero()) {
      throw new IllegalArgumentException(what + " " + d + " is not a positive duration");
    }
    try {
      long ms = d.toMillis();
      return Duration.ofMillis(ms).equals(d) ? ms : Math.addExact(ms, 1);
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException(what + " " + d + " is too long", e);
    }
  }
}

package io.nodekernel;

import java.nio.ByteBuffer;

/**
 * A direct buffer per thread for moving heap bytes to and from the native library (which only takes
 * direct buffers). Bigger requests get a buffer of their own, dropped after use.
 */
final class Scratch {
  /** The largest buffer a thread keeps. */
  static final int KEEP = 1 << 20;

  private static final ThreadLocal<ByteBuffer> BUFFER = new ThreadLocal<>();

  private Scratch() {}

  /** A direct buffer of at least {@code size} bytes, position 0, limit {@code size}. */
  static ByteBuffer get(int size) {
    if (size > KEEP) {
      return ByteBuffer.allocateDirect(size);
    }
    ByteBuffer b = BUFFER.get();
    if (b == null || b.capacity() < size) {
      b = ByteBuffer.allocateDirect(Math.max(size, 4096));
      BUFFER.set(b);
    }
    b.clear().limit(size);
    return b;
  }
}

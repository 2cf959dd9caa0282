package io.nodekernel;

import java.nio.ByteBuffer;

/**
 * The native entry points (crates/jni). Handles are keys into the library's tables, never pointers:
 * a stale one raises {@link IllegalStateException}. Buffers must be direct; each call reads or
 * writes bytes {@code [off, off + len)} of the buffer in place.
 */
final class Native {
  static {
    NativeLoader.load();
  }

  private Native() {}

  static native long connect(String meta, String configFile) throws NodeKernelException;

  static native void disconnect(long client);

  static native String[] errorCodeNames();

  /** Throws the exception of {@code code} as every failing call does (tests). */
  static native void raise(int code, String message) throws NodeKernelException;

  /** Panics inside the library (tests: the JVM must survive it). */
  static native void panicForTest();

  static native String localLocation();

  static native String location(long client) throws NodeKernelException;

  static native long[] lookup(long client, String path) throws NodeKernelException;

  static native long[] setAttrs(long client, String path, int mode, long mtimeNanos)
      throws NodeKernelException;

  /** {@code ttlMillis}: -1 never, otherwise positive. */
  static native long[] expire(long client, String path, long ttlMillis) throws NodeKernelException;

  /** {@code ttlMillis}: 0 none, otherwise positive. */
  static native long[] setChildTtl(long client, String path, long ttlMillis)
      throws NodeKernelException;

  static native Object[] list(long client, String path) throws NodeKernelException;

  static native String[] enumerate(long client, String path) throws NodeKernelException;

  static native void mkdir(long client, String path, boolean parents) throws NodeKernelException;

  static native long create(
      long client,
      String path,
      int type,
      int storageClass,
      boolean local,
      boolean pinned,
      boolean enumerable,
      int mode,
      long sizeHint,
      int bufferSize,
      int sliceSize,
      boolean openExisting,
      long ttlMillis,
      long childTtlMillis,
      long session)
      throws NodeKernelException;

  static native long append(long client, String path, int bufferSize, int sliceSize)
      throws NodeKernelException;

  static native void delete(long client, String path, boolean recursive) throws NodeKernelException;

  static native void rename(long client, String src, String dst, boolean replace)
      throws NodeKernelException;

  static native void put(long client, String path, ByteBuffer buf, int off, int len)
      throws NodeKernelException;

  static native byte[] get(long client, String path) throws NodeKernelException;

  static native byte[][] getMany(long client, String[] paths, int inFlight)
      throws NodeKernelException;

  static native void putMany(long client, String[] paths, byte[][] values, int inFlight)
      throws NodeKernelException;

  static native void deleteMany(long client, String[] paths, boolean recursive, int inFlight)
      throws NodeKernelException;

  static native long getInto(long client, String path, ByteBuffer buf, int off, int len)
      throws NodeKernelException;

  static native String[] blockLocations(long client, String path) throws NodeKernelException;

  static native long[] capacity(long client) throws NodeKernelException;

  /** A usage (see {@code Usage.of}); limits -1 for none. */
  static native long[] setQuota(long client, String path, long bytes, long nodes)
      throws NodeKernelException;

  /** A usage (see {@code Usage.of}). */
  static native long[] du(long client, String path) throws NodeKernelException;

  /** {@code {handle, granted lease in ms}}; {@code leaseMillis} 0: the default. */
  static native long[] openSession(long client, long leaseMillis) throws NodeKernelException;

  static native void closeSession(long session) throws NodeKernelException;

  /** Forgets the session without waiting: closed in the background, else its lease lapses. */
  static native void dropSession(long session);

  static native boolean sessionEnded(long session);

  static native void bindSession(long session, String path) throws NodeKernelException;

  /** {@code {handle, stat...}}. */
  static native long[] openReader(long client, String path) throws NodeKernelException;

  /** {@code {handle, total size}}. */
  static native long[] openBag(long client, String path, int readsInFlight)
      throws NodeKernelException;

  /** {@code {handle, total size}}. */
  static native long[] openRanges(
      long client, String[] paths, long[] offsets, long[] lengths, int readsInFlight)
      throws NodeKernelException;

  static native int read(long reader, ByteBuffer buf, int off, int len) throws NodeKernelException;

  static native int pread(long reader, long pos, ByteBuffer buf, int off, int len)
      throws NodeKernelException;

  static native void seek(long reader, long pos) throws NodeKernelException;

  static native void closeReader(long reader);

  static native void write(long writer, ByteBuffer buf, int off, int len)
      throws NodeKernelException;

  static native void flush(long writer) throws NodeKernelException;

  static native void sync(long writer) throws NodeKernelException;

  static native long position(long writer);

  static native void closeWriter(long writer, boolean abort) throws NodeKernelException;
}

package io.nodekernel;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.Objects;

/**
 * Reads a File or KeyValue (or a whole Bag). Reads into direct {@link ByteBuffer}s go straight from
 * storage into the buffer; reads into heap arrays go through a direct buffer of the stream's own.
 * Positional reads ({@link #read(long, ByteBuffer)}) do not move the stream. Not for use by several
 * threads at once (its methods are synchronized, so misuse is slow, not wrong).
 *
 * <p>The stream sees the node's size as of its opening. A Bag stream is sequential only.
 */
public final class NkInputStream extends InputStream {
  /** Bytes the stream buffers for reads into heap arrays. */
  static final int BUFFER = 64 << 10;

  private final String path;
  private final long size;
  private final boolean seekable;
  private final Handle handle;

  /** The logical position. */
  private long pos;

  /** Where the native stream stands (it moves only on native reads and seeks). */
  private long nativePos;

  /** Read-ahead for heap reads: bytes {@code [buf.position(), buf.limit())} are at {@code pos}. */
  private ByteBuffer buf;

  private ByteBuffer pbuf;

  NkInputStream(String path, long handle, long size, boolean seekable) {
    this.path = path;
    this.handle = new Handle(this, handle, Native::closeReader);
    this.size = size;
    this.seekable = seekable;
  }

  /** The node's path. */
  public String path() {
    return path;
  }

  /** Bytes in the stream (the node's size when it was opened; a Bag's total). */
  public long size() {
    return size;
  }

  /** The stream's position; a closed stream throws {@link IOException}. */
  public synchronized long position() throws IOException {
    check();
    return pos;
  }

  /** Where the stream stood, also after it was closed. */
  public synchronized long lastPosition() {
    return pos;
  }

  /** Whether {@link #close()} was called. */
  public boolean isClosed() {
    return handle.get() == 0;
  }

  public boolean isSeekable() {
    return seekable;
  }

  private long check() throws IOException {
    long h = handle.get();
    if (h == 0) {
      throw new IOException("Stream is closed: " + path);
    }
    return h;
  }

  private int buffered() {
    return buf == null ? 0 : buf.remaining();
  }

  /** Moves the native stream to the logical position. */
  private void align() throws IOException {
    if (nativePos != pos) {
      Native.seek(check(), pos);
      nativePos = pos;
    }
  }

  private boolean fill() throws IOException {
    if (buf == null) {
      buf = ByteBuffer.allocateDirect(BUFFER);
    }
    align();
    int n = Native.read(check(), buf, 0, buf.capacity());
    if (n <= 0) {
      buf.clear().limit(0);
      return false;
    }
    nativePos += n;
    buf.clear().limit(n);
    return true;
  }

  @Override
  public synchronized int read() throws IOException {
    check();
    if (buffered() == 0 && !fill()) {
      return -1;
    }
    pos++;
    return buf.get() & 0xff;
  }

  @Override
  public synchronized int read(byte[] b, int off, int len) throws IOException {
    Objects.checkFromIndexSize(off, len, b.length);
    check();
    if (len == 0) {
      return 0;
    }
    if (buffered() == 0 && !fill()) {
      return -1;
    }
    int n = Math.min(len, buf.remaining());
    buf.get(b, off, n);
    pos += n;
    return n;
  }

  /**
   * Reads up to {@code dst.remaining()} bytes at the stream's position into {@code dst}, advancing
   * both; -1 at the end, 0 if {@code dst} has no room. A direct buffer is filled in place.
   */
  public synchronized int read(ByteBuffer dst) throws IOException {
    check();
    if (dst.isReadOnly()) {
      throw new java.nio.ReadOnlyBufferException();
    }
    if (!dst.hasRemaining()) {
      return 0;
    }
    if (buffered() > 0 || !dst.isDirect()) {
      if (buffered() == 0 && !fill()) {
        return -1;
      }
      int n = Math.min(dst.remaining(), buf.remaining());
      ByteBuffer part = buf.duplicate();
      part.limit(part.position() + n);
      dst.put(part);
      buf.position(buf.position() + n);
      pos += n;
      return n;
    }
    align();
    int n = Native.read(check(), dst, dst.position(), dst.remaining());
    if (n <= 0) {
      return -1;
    }
    nativePos += n;
    pos += n;
    dst.position(dst.position() + n);
    return n;
  }

  /**
   * Reads up to {@code dst.remaining()} bytes at {@code position} into {@code dst} without moving
   * the stream; -1 if {@code position} is at or past the end.
   */
  public synchronized int read(long position, ByteBuffer dst) throws IOException {
    check();
    if (!seekable) {
      throw new UnsupportedOperationException("a Bag stream reads sequentially only: " + path);
    }
    if (position < 0) {
      throw new EOFException("negative position " + position + " in " + path);
    }
    if (dst.isReadOnly()) {
      throw new java.nio.ReadOnlyBufferException();
    }
    if (!dst.hasRemaining()) {
      return position >= size ? -1 : 0;
    }
    if (dst.isDirect()) {
      int n = Native.pread(check(), position, dst, dst.position(), dst.remaining());
      if (n > 0) {
        dst.position(dst.position() + n);
      }
      return n;
    }
    if (pbuf == null) {
      pbuf = ByteBuffer.allocateDirect(BUFFER);
    }
    int want = Math.min(dst.remaining(), pbuf.capacity());
    int n = Native.pread(check(), position, pbuf, 0, want);
    if (n > 0) {
      pbuf.clear().limit(n);
      dst.put(pbuf);
    }
    return n;
  }

  /** {@link #read(long, ByteBuffer)} into an array. */
  public int read(long position, byte[] b, int off, int len) throws IOException {
    Objects.checkFromIndexSize(off, len, b.length);
    return read(position, ByteBuffer.wrap(b, off, len));
  }

  /**
   * Moves the stream to {@code to}, which may be the end but not past it ({@link EOFException}). A
   * Bag stream cannot seek.
   */
  public synchronized void seek(long to) throws IOException {
    check();
    if (to < 0) {
      throw new EOFException("Cannot seek to a negative offset: " + to + " in " + path);
    }
    if (to > size) {
      throw new EOFException(
          "Attempted to seek or read past the end of the file: "
              + to
              + " > "
              + size
              + " in "
              + path);
    }
    if (to == pos) {
      return;
    }
    if (!seekable) {
      throw new UnsupportedOperationException("a Bag stream reads sequentially only: " + path);
    }
    long bufStart = pos - (buf == null ? 0 : buf.position());
    if (buf != null && to >= bufStart && to < pos + buf.remaining()) {
      buf.position((int) (to - bufStart));
    } else if (buf != null) {
      buf.clear().limit(0);
    }
    pos = to;
  }

  @Override
  public synchronized long skip(long n) throws IOException {
    check();
    if (n <= 0) {
      return 0;
    }
    long to = Math.min(size, pos + n);
    if (!seekable) {
      byte[] sink = new byte[8192];
      long skipped = 0;
      while (skipped < n) {
        int r = read(sink, 0, (int) Math.min(sink.length, n - skipped));
        if (r < 0) {
          break;
        }
        skipped += r;
      }
      return skipped;
    }
    long skipped = to - pos;
    seek(to);
    return skipped;
  }

  /**
   * Releases the stream's buffers and the native read-ahead (up to several MiB) while keeping its
   * position: for streams held open but idle. The next read starts a new read-ahead. Does nothing
   * on a closed stream.
   */
  public synchronized void unbuffer() {
    long h = handle.get();
    if (h == 0) {
      return;
    }
    buf = null;
    pbuf = null;
    try {
      Native.seek(h, pos);
      nativePos = pos;
    } catch (IOException e) {
      // Only a Bag stream refuses a seek: it keeps its read-ahead.
    }
  }

  @Override
  public synchronized int available() throws IOException {
    check();
    return (int) Math.min(Integer.MAX_VALUE, Math.max(0, size - pos));
  }

  /** Closes the stream; closing twice does nothing. A stream collected unclosed is closed then. */
  @Override
  public synchronized void close() {
    long h = handle.take();
    buf = null;
    pbuf = null;
    if (h != 0) {
      Native.closeReader(h);
    }
  }
}

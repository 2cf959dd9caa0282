package io.nodekernel;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.util.Objects;

/**
 * Writes a File or KeyValue. Writes from direct {@link ByteBuffer}s go straight from the buffer to
 * storage; small writes and heap arrays are gathered in a direct buffer of the stream's own first.
 * Nothing is visible to readers before {@link #sync()} (a File) or {@link #close()}; the native
 * writer keeps several transfers in flight meanwhile.
 *
 * <p>A stream collected unclosed is aborted. If a write fails, the stream is poisoned: every later
 * call throws the same failure, and {@link #close()} publishes nothing new (use {@link #abort()}).
 * Not for use by several threads at once (its methods are synchronized).
 */
public final class NkOutputStream extends OutputStream {
  /** Bytes gathered before they go to the native writer. */
  static final int BUFFER = 64 << 10;

  private final String path;
  private final Handle handle;
  private ByteBuffer buf;
  private long written;

  NkOutputStream(String path, long handle) {
    this.path = path;
    this.handle = new Handle(this, handle, NkOutputStream::abandon);
  }

  /** What happens to a stream collected unclosed: nothing new is published. */
  private static void abandon(long h) {
    try {
      Native.closeWriter(h, true);
    } catch (IOException | RuntimeException e) {
      // Nobody to tell: the lease runs out on the metadata server.
    }
  }

  public String path() {
    return path;
  }

  /** Bytes accepted by this stream so far, plus the node's size when it was opened. */
  public synchronized long position() throws IOException {
    return Native.position(check()) + (buf == null ? 0 : buf.position());
  }

  /** Whether {@link #close()} or {@link #abort()} was called. */
  public boolean isClosed() {
    return handle.get() == 0;
  }

  /** Bytes accepted by this stream so far. */
  public synchronized long bytesWritten() {
    return written;
  }

  private long check() throws IOException {
    long h = handle.get();
    if (h == 0) {
      throw new IOException("Stream is closed: " + path);
    }
    return h;
  }

  private ByteBuffer buffer() {
    if (buf == null) {
      buf = ByteBuffer.allocateDirect(BUFFER);
    }
    return buf;
  }

  /** Hands the gathered bytes to the native writer. */
  private void drain() throws IOException {
    if (buf != null && buf.position() > 0) {
      int n = buf.position();
      buf.clear();
      Native.write(check(), buf, 0, n);
    }
  }

  @Override
  public synchronized void write(int b) throws IOException {
    check();
    ByteBuffer bb = buffer();
    if (!bb.hasRemaining()) {
      drain();
    }
    bb.put((byte) b);
    written++;
  }

  @Override
  public synchronized void write(byte[] b, int off, int len) throws IOException {
    Objects.checkFromIndexSize(off, len, b.length);
    check();
    ByteBuffer bb = buffer();
    while (len > 0) {
      if (!bb.hasRemaining()) {
        drain();
      }
      int n = Math.min(len, bb.remaining());
      bb.put(b, off, n);
      off += n;
      len -= n;
      written += n;
    }
  }

  /** Writes the buffer's remaining bytes, advancing its position; a direct one is read in place. */
  public synchronized void write(ByteBuffer src) throws IOException {
    check();
    if (!src.isDirect() || src.remaining() < BUFFER / 4) {
      ByteBuffer bb = buffer();
      while (src.hasRemaining()) {
        if (!bb.hasRemaining()) {
          drain();
        }
        int n = Math.min(src.remaining(), bb.remaining());
        ByteBuffer part = src.duplicate();
        part.limit(part.position() + n);
        bb.put(part);
        src.position(src.position() + n);
        written += n;
      }
      return;
    }
    drain();
    int n = src.remaining();
    Native.write(check(), src, src.position(), n);
    src.position(src.limit());
    written += n;
  }

  /**
   * Hands buffered bytes on and waits until every byte written so far is stored; they are not yet
   * visible to readers (see {@link #sync()}).
   */
  @Override
  public synchronized void flush() throws IOException {
    drain();
    Native.flush(check());
  }

  /**
   * Makes every byte written so far durable in the cluster and visible to readers (the File's size
   * grows to it), and renews the write lease. Hadoop's {@code hflush} and {@code hsync}.
   */
  public synchronized void sync() throws IOException {
    drain();
    Native.sync(check());
  }

  /**
   * Publishes everything and releases the node. After a failure the node keeps what its last sync
   * published. Closing twice does nothing.
   */
  @Override
  public synchronized void close() throws IOException {
    if (handle.get() == 0) {
      return;
    }
    try {
      drain();
    } catch (IOException | RuntimeException e) {
      buf = null;
      long h = handle.take();
      try {
        Native.closeWriter(h, true);
      } catch (IOException | RuntimeException suppressed) {
        e.addSuppressed(suppressed);
      }
      throw e;
    }
    buf = null;
    Native.closeWriter(handle.take(), false);
  }

  /**
   * Gives up: drops unsent bytes and releases the node without publishing them (a new KeyValue
   * leaves nothing behind; a File keeps what its last sync published).
   */
  public synchronized void abort() throws IOException {
    long h = handle.take();
    buf = null;
    if (h != 0) {
      Native.closeWriter(h, true);
    }
  }
}

package io.nodekernel.hadoop;

import io.nodekernel.NkInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Locale;
import org.apache.hadoop.fs.ByteBufferPositionedReadable;
import org.apache.hadoop.fs.ByteBufferReadable;
import org.apache.hadoop.fs.CanUnbuffer;
import org.apache.hadoop.fs.FSExceptionMessages;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.StreamCapabilities;

/**
 * A NodeKernel File or KeyValue as Hadoop reads it: seekable, positional reads that leave the
 * stream where it was, and reads into {@link ByteBuffer}s (a direct buffer is filled in place by
 * the native client, no copy). The stream sees the node's size as of its opening, as a File's
 * readers see the size its writer last published.
 */
public final class NodeKernelInputStream extends FSInputStream
    implements ByteBufferReadable, ByteBufferPositionedReadable, CanUnbuffer, StreamCapabilities {
  private final NkInputStream in;
  private final FileSystem.Statistics statistics;

  NodeKernelInputStream(NkInputStream in, FileSystem.Statistics statistics) {
    this.in = in;
    this.statistics = statistics;
  }

  /** Bytes readable: the node's size when it was opened. */
  public long size() {
    return in.size();
  }

  private void checkOpen() throws IOException {
    if (in.isClosed()) {
      throw new IOException(FSExceptionMessages.STREAM_IS_CLOSED + ": " + in.path());
    }
  }

  private int counted(int n) {
    if (n > 0 && statistics != null) {
      statistics.incrementBytesRead(n);
    }
    return n;
  }

  @Override
  public void seek(long pos) throws IOException {
    in.seek(pos);
  }

  /** The position, also after close (as HDFS answers). */
  @Override
  public long getPos() {
    return in.lastPosition();
  }

  /** There is one copy of each block: no other source to try. */
  @Override
  public boolean seekToNewSource(long targetPos) {
    return false;
  }

  @Override
  public int read() throws IOException {
    int b = in.read();
    if (b >= 0) {
      counted(1);
    }
    return b;
  }

  @Override
  public int read(byte[] b, int off, int len) throws IOException {
    return counted(in.read(b, off, len));
  }

  @Override
  public long skip(long n) throws IOException {
    return in.skip(n);
  }

  @Override
  public int available() throws IOException {
    return in.available();
  }

  /** Reads at {@code position} without moving the stream; -1 at or past the end. */
  @Override
  public int read(long position, byte[] buffer, int offset, int length) throws IOException {
    validatePositionedReadArgs(position, buffer, offset, length);
    if (length == 0) {
      return 0;
    }
    checkOpen();
    if (position >= in.size()) {
      return -1;
    }
    return counted(in.read(position, buffer, offset, length));
  }

  /** {@link ByteBufferReadable}: a direct buffer is filled in place. */
  @Override
  public int read(ByteBuffer buf) throws IOException {
    return counted(in.read(buf));
  }

  /** {@link ByteBufferPositionedReadable}: reads at {@code position}, the stream stays put. */
  @Override
  public int read(long position, ByteBuffer buf) throws IOException {
    if (position < 0) {
      throw new EOFException("negative position " + position + " in " + in.path());
    }
    checkOpen();
    if (!buf.hasRemaining()) {
      return 0;
    }
    if (position >= in.size()) {
      return -1;
    }
    return counted(in.read(position, buf));
  }

  @Override
  public void readFully(long position, ByteBuffer buf) throws IOException {
    long at = position;
    while (buf.hasRemaining()) {
      int n = read(at, buf);
      if (n < 0) {
        throw new EOFException(
            "End of file reached before reading fully: " + in.path() + " at " + at);
      }
      at += n;
    }
  }

  @Override
  public boolean hasCapability(String capability) {
    switch (capability.toLowerCase(Locale.ROOT)) {
      case StreamCapabilities.READBYTEBUFFER:
      case StreamCapabilities.PREADBYTEBUFFER:
      case StreamCapabilities.UNBUFFER:
        return true;
      default:
        return false;
    }
  }

  /** Drops the stream's buffers and read-ahead; the next read starts a new one. */
  @Override
  public void unbuffer() {
    in.unbuffer();
  }

  @Override
  public void close() {
    in.close();
  }

  @Override
  public String toString() {
    return "NodeKernelInputStream{" + in.path() + ", size=" + in.size() + "}";
  }
}

package io.nodekernel.spark;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;

/**
 * The next {@code length} bytes of a shared stream, as a stream of their own: one map segment of a
 * reducer's multistream. Closing it skips what was not read, so the next segment starts in place;
 * the shared stream stays open.
 */
final class BoundedInput extends InputStream {
  private final InputStream in;
  private long left;

  BoundedInput(InputStream in, long length) {
    this.in = in;
    this.left = length;
  }

  @Override
  public int read() throws IOException {
    if (left == 0) {
      return -1;
    }
    int b = in.read();
    if (b < 0) {
      throw new EOFException("segment cut short: " + left + " bytes missing");
    }
    left--;
    return b;
  }

  @Override
  public int read(byte[] b, int off, int len) throws IOException {
    if (len == 0) {
      return 0;
    }
    if (left == 0) {
      return -1;
    }
    int n = in.read(b, off, (int) Math.min(len, left));
    if (n < 0) {
      throw new EOFException("segment cut short: " + left + " bytes missing");
    }
    left -= n;
    return n;
  }

  @Override
  public int available() throws IOException {
    return (int) Math.min(in.available(), left);
  }

  @Override
  public void close() throws IOException {
    while (left > 0) {
      long n = in.skip(left);
      if (n <= 0) {
        throw new EOFException("segment cut short: " + left + " bytes missing");
      }
      left -= n;
    }
  }
}

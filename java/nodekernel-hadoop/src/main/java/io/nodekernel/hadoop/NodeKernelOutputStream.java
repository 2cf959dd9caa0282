package io.nodekernel.hadoop;

import io.nodekernel.NkOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.util.Locale;
import org.apache.hadoop.fs.StreamCapabilities;
import org.apache.hadoop.fs.Syncable;

/**
 * Writes a NodeKernel File for Hadoop. {@link #hflush()} and {@link #hsync()} both publish: every
 * byte written so far becomes durable in the cluster and visible to new readers (NodeKernel's
 * {@code sync}; there is no weaker "visible but not stored" step). {@link #flush()} only hands the
 * buffered bytes to the native writer, which sends them while the caller goes on; it makes nothing
 * visible (Hadoop promises nothing more for {@code flush}).
 */
public final class NodeKernelOutputStream extends OutputStream
    implements Syncable, StreamCapabilities {
  // Hadoop's names; its StreamCapabilities.HFLUSH/HSYNC constants are deprecated.
  private static final String HFLUSH = "hflush";
  private static final String HSYNC = "hsync";

  private final NkOutputStream out;

  NodeKernelOutputStream(NkOutputStream out) {
    this.out = out;
  }

  @Override
  public void write(int b) throws IOException {
    out.write(b);
  }

  @Override
  public void write(byte[] b, int off, int len) throws IOException {
    out.write(b, off, len);
  }

  /**
   * Nothing to do: the stream gathers small writes in a buffer that goes to the writer when it
   * fills, and waiting here for storage would make every {@code flush} a round trip.
   */
  @Override
  public void flush() {}

  /** Publishes every byte written so far: new readers see them. */
  @Override
  public void hflush() throws IOException {
    out.sync();
  }

  /** As {@link #hflush()}: a NodeKernel sync is both visible and stored. */
  @Override
  public void hsync() throws IOException {
    out.sync();
  }

  @Override
  public boolean hasCapability(String capability) {
    switch (capability.toLowerCase(Locale.ROOT)) {
      case HFLUSH:
      case HSYNC:
        return true;
      default:
        return false;
    }
  }

  /** Publishes everything and releases the File; closing twice does nothing. */
  @Override
  public void close() throws IOException {
    out.close();
  }

  @Override
  public String toString() {
    return "NodeKernelOutputStream{" + out.path() + "}";
  }
}

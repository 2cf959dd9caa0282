package io.nodekernel.spark;

import io.nodekernel.NkOutputStream;
import java.io.EOFException;
import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.WritableByteChannel;
import java.nio.file.StandardOpenOption;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.Optional;
import java.util.Set;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.api.ShuffleMapOutputWriter;
import org.apache.spark.shuffle.api.ShufflePartitionWriter;
import org.apache.spark.shuffle.api.WritableByteChannelWrapper;
import org.apache.spark.shuffle.api.metadata.MapOutputCommitMessage;

/**
 * One map attempt's output. Each non-empty partition becomes one segment appended to the File
 * {@code p<p>/e<exec>-t<slot>} of the task's slot, published when its stream closes; the index
 * {@code idx/m<mapTaskId>} written at commit says where the segments are. An aborted attempt leaves
 * no index, so no reducer reads its segments (they are dead space until the shuffle is removed).
 */
final class NkMapOutputWriter implements ShuffleMapOutputWriter {
  /** The buffer a spill file is copied through. */
  private static final int COPY_BUFFER = 1 << 20;

  private final NodeKernelShuffleManager manager;
  private final int shuffleId;
  private final long mapTaskId;
  private final ShuffleWriteMetricsReporter metrics;
  private final long[] offsets;
  private final long[] lengths;
  private final int slot;
  private final boolean direct;
  private int lastPartition = -1;

  /**
   * The segments being written (Spark's writers write one at a time, {@link NkDirectWriter} all).
   */
  private final Set<NkOutputStream> open = Collections.newSetFromMap(new IdentityHashMap<>());

  private boolean done;

  /**
   * The first failure of a segment stream (opening its File, writing, publishing). Kryo's {@code
   * Output.close()} ignores the IOException of the stream it closes, and that close is where LZ4
   * writes a segment's last bytes, so a writer may go on to commit as if the segment were written:
   * the commit throws it instead (else the map output would be committed without the segment, an
   * empty MapStatus, and reducers would silently read nothing of it).
   */
  private IOException streamFailed;

  NkMapOutputWriter(
      NodeKernelShuffleManager manager,
      int shuffleId,
      long mapTaskId,
      int numPartitions,
      ShuffleWriteMetricsReporter metrics,
      boolean direct) {
    this.manager = manager;
    this.shuffleId = shuffleId;
    this.mapTaskId = mapTaskId;
    this.metrics = metrics;
    this.offsets = new long[numPartitions];
    this.lengths = new long[numPartitions];
    this.direct = direct;
    this.slot = manager.slots().acquire();
  }

  @Override
  public synchronized ShufflePartitionWriter getPartitionWriter(int p) {
    if (done) {
      throw new IllegalStateException("map output of task " + mapTaskId + " already finished");
    }
    if (p <= lastPartition || p >= lengths.length) {
      throw new IllegalArgumentException(
          "partition " + p + " after " + lastPartition + " of " + lengths.length);
    }
    lastPartition = p;
    return new PartitionWriter(p);
  }

  @Override
  public synchronized MapOutputCommitMessage commitAllPartitions(long[] checksums)
      throws IOException {
    if (done) {
      throw new IllegalStateException("map output of task " + mapTaskId + " already finished");
    }
    if (streamFailed != null) {
      throw new IOException(
          "a segment of map task " + mapTaskId + " was not written: " + streamFailed, streamFailed);
    }
    if (!open.isEmpty()) {
      throw new IllegalStateException("a partition stream of task " + mapTaskId + " is open");
    }
    MapIndex index = MapIndex.of(manager.executorId(), slot, manager.location(), offsets, lengths);
    long t0 = System.nanoTime();
    manager.client().put(manager.indexPath(shuffleId, mapTaskId), index.encode());
    metrics.incWriteTime(System.nanoTime() - t0);
    finish();
    return MapOutputCommitMessage.of(lengths.clone());
  }

  /**
   * Copies the partitions of a local spill file, {@code lengths[p]} bytes each in partition order,
   * to their segments.
   */
  void copySpill(File spill, long[] lengths) throws IOException {
    if (lengths.length != this.lengths.length) {
      throw new IllegalArgumentException(
          lengths.length + " partition lengths for " + this.lengths.length + " partitions");
    }
    ByteBuffer buf = ByteBuffer.allocateDirect(COPY_BUFFER);
    try (FileChannel in = FileChannel.open(spill.toPath(), StandardOpenOption.READ)) {
      long pos = 0;
      for (int p = 0; p < lengths.length; p++) {
        if (lengths[p] == 0) {
          continue;
        }
        try (SegmentStream out = new SegmentStream((PartitionWriter) getPartitionWriter(p))) {
          for (long end = pos + lengths[p]; pos < end; ) {
            buf.clear().limit((int) Math.min(buf.capacity(), end - pos));
            int n = in.read(buf, pos);
            if (n < 0) {
              throw new EOFException(
                  spill + " ends at " + pos + ", before partition " + p + " does");
            }
            pos += n;
            out.write(buf.flip());
          }
        }
      }
    }
  }

  @Override
  public synchronized void abort(Throwable error) {
    if (done) {
      return;
    }
    try {
      for (NkOutputStream out : open) {
        try {
          out.abort();
        } catch (IOException e) {
          if (error != null) {
            error.addSuppressed(e);
          }
        }
      }
    } finally {
      open.clear();
      finish();
    }
  }

  /** Records a segment stream's failure for the commit to throw; returns it. */
  private synchronized IOException failed(IOException e) {
    if (streamFailed == null) {
      streamFailed = e;
    }
    return e;
  }

  private void finish() {
    done = true;
    if (streamFailed == null) {
      manager.slots().release(slot);
    } else {
      // A slot File that failed may stay unwritable for a while (a failed publish can leave its
      // write lease held until the lease times out): later tasks of this executor take other
      // slots, and so other Files.
      manager.slots().retire(slot);
    }
  }

  private final class PartitionWriter implements ShufflePartitionWriter {
    private final int p;
    private long written;

    PartitionWriter(int p) {
      this.p = p;
    }

    @Override
    public OutputStream openStream() {
      return new SegmentStream(this);
    }

    /**
     * Where {@code UnsafeShuffleWriter} merges several spills with {@code transferTo}: the spill
     * files' bytes come through the channel in direct buffers, written in place.
     */
    @Override
    public Optional<WritableByteChannelWrapper> openChannelWrapper() {
      manager.countChannel();
      return Optional.of(new SegmentChannel(new SegmentStream(this)));
    }

    @Override
    public long getNumBytesWritten() {
      return written;
    }
  }

  /** A segment written as a channel; its bytes count as the stream's do. */
  private static final class SegmentChannel
      implements WritableByteChannel, WritableByteChannelWrapper {
    private final SegmentStream out;

    SegmentChannel(SegmentStream out) {
      this.out = out;
    }

    @Override
    public WritableByteChannel channel() {
      return this;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
      int n = src.remaining();
      out.write(src);
      return n;
    }

    @Override
    public boolean isOpen() {
      return !out.closed;
    }

    @Override
    public void close() throws IOException {
      out.close();
    }
  }

  /**
   * A segment opened at its first byte: partitions that get no bytes create nothing (a MapStatus
   * size of 0 means no block).
   */
  private final class SegmentStream extends OutputStream {
    private final PartitionWriter pw;
    private NkOutputStream out;
    private boolean closed;

    SegmentStream(PartitionWriter pw) {
      this.pw = pw;
    }

    private NkOutputStream out() throws IOException {
      if (closed) {
        throw new IOException("segment stream closed");
      }
      if (out == null) {
        synchronized (NkMapOutputWriter.this) {
          if (done) {
            throw new IllegalStateException("map output of task " + mapTaskId + " not writable");
          }
          long t0 = System.nanoTime();
          try {
            out = manager.openSlotFile(shuffleId, pw.p, slot, direct);
          } catch (IOException e) {
            throw failed(e);
          }
          offsets[pw.p] = out.position();
          open.add(out);
          metrics.incWriteTime(System.nanoTime() - t0);
        }
      }
      return out;
    }

    @Override
    public void write(int b) throws IOException {
      NkOutputStream o = out();
      try {
        o.write(b);
      } catch (IOException e) {
        throw failed(e);
      }
      pw.written++;
    }

    /** Writes the buffer's remaining bytes. */
    void write(ByteBuffer src) throws IOException {
      int len = src.remaining();
      if (len == 0) {
        return;
      }
      NkOutputStream o = out();
      long t0 = System.nanoTime();
      try {
        o.write(src);
      } catch (IOException e) {
        throw failed(e);
      }
      metrics.incWriteTime(System.nanoTime() - t0);
      pw.written += len;
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      if (len == 0) {
        return;
      }
      NkOutputStream o = out();
      long t0 = System.nanoTime();
      try {
        o.write(b, off, len);
      } catch (IOException e) {
        throw failed(e);
      }
      metrics.incWriteTime(System.nanoTime() - t0);
      pw.written += len;
    }

    @Override
    public void close() throws IOException {
      if (closed) {
        return;
      }
      closed = true;
      if (out == null) {
        return;
      }
      synchronized (NkMapOutputWriter.this) {
        if (!open.contains(out)) {
          return; // aborted meanwhile
        }
        long t0 = System.nanoTime();
        try {
          out.close();
        } catch (IOException e) {
          throw failed(e);
        }
        metrics.incWriteTime(System.nanoTime() - t0);
        open.remove(out);
        lengths[pw.p] = pw.written;
      }
    }
  }
}

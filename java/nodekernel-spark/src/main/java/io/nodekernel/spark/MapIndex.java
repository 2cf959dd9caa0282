package io.nodekernel.spark;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Arrays;

/**
 * Where one map attempt's segments lie: the executor and slot whose Files hold them, the host that
 * wrote them, and (partition, offset, length) of each non-empty segment, partitions ascending.
 * Stored as the KeyValue {@code idx/m<mapTaskId>}, written last: it is the attempt's commit marker.
 */
final class MapIndex {
  private static final int VERSION = 1;

  final String execId;
  final int slot;
  final String host;
  private final int[] partitions;
  private final long[] offsets;
  private final long[] lengths;

  MapIndex(String execId, int slot, String host, int[] partitions, long[] offsets, long[] lengths) {
    this.execId = execId;
    this.slot = slot;
    this.host = host;
    this.partitions = partitions;
    this.offsets = offsets;
    this.lengths = lengths;
  }

  /** The index of segments {@code lengths[p] > 0} at {@code offsets[p]}. */
  static MapIndex of(String execId, int slot, String host, long[] offsets, long[] lengths) {
    int n = 0;
    for (long len : lengths) {
      n += len > 0 ? 1 : 0;
    }
    int[] parts = new int[n];
    long[] offs = new long[n];
    long[] lens = new long[n];
    int i = 0;
    for (int p = 0; p < lengths.length; p++) {
      if (lengths[p] > 0) {
        parts[i] = p;
        offs[i] = offsets[p];
        lens[i] = lengths[p];
        i++;
      }
    }
    return new MapIndex(execId, slot, host, parts, offs, lens);
  }

  /** The slot File of partition {@code p} under the shuffle directory {@code dir}. */
  String file(String dir, int p) {
    return dir + "/p" + p + "/e" + execId + "-t" + slot;
  }

  /** Position of partition {@code p}'s segment, or -1 when it has none. */
  int find(int p) {
    int i = Arrays.binarySearch(partitions, p);
    return i < 0 ? -1 : i;
  }

  /** The number of segments. */
  int segments() {
    return partitions.length;
  }

  long offset(int i) {
    return offsets[i];
  }

  long length(int i) {
    return lengths[i];
  }

  byte[] encode() {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream(32 + 20 * partitions.length);
    try (DataOutputStream out = new DataOutputStream(bytes)) {
      out.writeInt(VERSION);
      out.writeUTF(execId);
      out.writeInt(slot);
      out.writeUTF(host);
      out.writeInt(partitions.length);
      for (int i = 0; i < partitions.length; i++) {
        out.writeInt(partitions[i]);
        out.writeLong(offsets[i]);
        out.writeLong(lengths[i]);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return bytes.toByteArray();
  }

  static MapIndex decode(byte[] b) throws IOException {
    DataInputStream in = new DataInputStream(new ByteArrayInputStream(b));
    int version = in.readInt();
    if (version != VERSION) {
      throw new IOException("map index version " + version + ", expected " + VERSION);
    }
    String execId = in.readUTF();
    int slot = in.readInt();
    String host = in.readUTF();
    int n = in.readInt();
    if (n < 0 || n > in.available() / 20) {
      throw new IOException("map index claims " + n + " segments in " + b.length + " bytes");
    }
    int[] parts = new int[n];
    long[] offs = new long[n];
    long[] lens = new long[n];
    for (int i = 0; i < n; i++) {
      parts[i] = in.readInt();
      offs[i] = in.readLong();
      lens[i] = in.readLong();
      if (i > 0 && parts[i] <= parts[i - 1]) {
        throw new IOException("map index partitions out of order");
      }
    }
    if (in.available() != 0) {
      throw new IOException("map index has trailing bytes");
    }
    return new MapIndex(execId, slot, host, parts, offs, lens);
  }
}
